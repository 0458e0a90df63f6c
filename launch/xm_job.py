"""The parts of the xmanager launcher that need no xmanager: accelerators, job arguments, the image.

`launch/xm_launch.py` turns these into xm objects; keeping them here lets the project's own venv
(which cannot hold xmanager: it pins protobuf < 7) test them.
"""
from __future__ import annotations

import dataclasses
import pathlib
import re
import shutil
import subprocess


@dataclasses.dataclass(frozen=True)
class Accelerator:
    """One accelerator choice: its xm resource name, the pip extra it needs, how its topology reads."""
    xm_resource: str | None   # key for xm.JobRequirements (None: CPU only)
    extra: str                # setup.py extra ('' = the base install)
    topology_dims: int        # TPU: 2 ('4x4') or 3 ('2x2x2'); GPU/CPU: 0 (a plain count)


ACCELERATORS = {
    "cpu": Accelerator(None, "", 0),
    "tpu_v5e": Accelerator("tpu_v5e", "tpu", 2),
    "tpu_v5p": Accelerator("tpu_v5p", "tpu", 3),
    "tpu_v6e": Accelerator("tpu_v6e", "tpu", 2),
    "tpu_v4": Accelerator("tpu_v4", "tpu", 3),
    "a100": Accelerator("a100", "gpu", 0),
    "h100": Accelerator("h100", "gpu", 0),
    "h200": Accelerator("h200", "gpu", 0),
    "local_gpu": Accelerator("local_gpu", "gpu", 0),
}

BASE_IMAGE = "python:3.11-slim-bookworm"  # Debian 12: Debian's chromium package, Python 3.11 as setup.py needs
SOURCE_DIRNAME = "rmsweb"                 # folder name of the staged repo inside the build context


def accelerator(name: str) -> Accelerator:
    """Returns the Accelerator called `name` (see ACCELERATORS)."""
    if name not in ACCELERATORS:
        raise ValueError(f"--accelerator={name!r}: expected one of {sorted(ACCELERATORS)}")
    return ACCELERATORS[name]


def requirements_kwargs(name: str, topology: str) -> dict[str, str]:
    """Returns the kwargs for xm.JobRequirements, e.g. {'tpu_v5e': '4x4'} or {'h100': '8'}; {} for CPU."""
    acc = accelerator(name)
    if acc.xm_resource is None:
        if topology:
            raise ValueError(f"--topology={topology!r} makes no sense with --accelerator=cpu")
        return {}
    if acc.topology_dims:
        pattern = "x".join([r"[1-9]\d*"] * acc.topology_dims)
        if not re.fullmatch(pattern, topology or ""):
            example = "4x4" if acc.topology_dims == 2 else "2x2x2"
            raise ValueError(f"--topology={topology!r}: {name} needs a {acc.topology_dims}-D chip grid like {example}")
    elif not re.fullmatch(r"[1-9]\d*", topology or ""):
        raise ValueError(f"--topology={topology!r}: {name} needs a device count like 8")
    return {acc.xm_resource: topology}


def chip_count(topology: str) -> int:
    """Returns the number of chips (or GPUs) in a topology string such as '4x4' or '8'."""
    count = 1
    for dim in topology.split("x"):
        count *= int(dim)
    return count


def job_args(config: str, workdir: str, overrides: list[str]) -> list[str]:
    """Returns rmsweb_jax.main's argv: --config, --workdir, then each override as --config.KEY=VALUE."""
    if not config:
        raise ValueError("--config is required, e.g. configs/qwen3_vl_8b.py")
    if not workdir:
        raise ValueError("--workdir is required, e.g. /gcs/BUCKET/runs/8b on Vertex")
    args = [f"--config={config}", f"--workdir={workdir}"]
    for item in overrides:
        key, sep, value = item.partition("=")
        key = key.removeprefix("--").removeprefix("config.")
        if not sep or not re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*", key):
            raise ValueError(f"--override={item!r}: expected KEY=VALUE with a dotted config key, e.g. model.init=hf:/ckpt")
        args.append(f"--config.{key}={value}")
    return args


def job_env(name: str, replicas: int, extra_env: list[str]) -> dict[str, str]:
    """Returns the job's environment: RMSWEB_DISTRIBUTED=1 where JAX runs multi-process, plus KEY=VALUE items."""
    env = {}
    # TPU VMs auto-detect their slice; GPU jobs are multi-process only with several replicas.
    if accelerator(name).extra == "tpu" or replicas > 1:
        env["RMSWEB_DISTRIBUTED"] = "1"
    for item in extra_env:
        key, sep, value = item.partition("=")
        if not sep or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            raise ValueError(f"--env={item!r}: expected KEY=VALUE")
        env[key] = value
    return env


def parse_mounts(items: list[str]) -> dict[str, str]:
    """Returns {host path: container path} from HOST:CONTAINER items (the local backend's docker volumes)."""
    volumes = {}
    for item in items:
        host, sep, container = item.partition(":")
        if not sep or not host.startswith("/") or not container.startswith("/"):
            raise ValueError(f"--mount={item!r}: expected /host/path:/container/path")
        volumes[host] = container
    return volumes


def docker_instructions(extra: str, *, with_constraints: bool, with_chromium: bool) -> list[str]:
    """Returns the Dockerfile steps that install the staged repo (xm appends the entrypoint)."""
    project = f"/workdir/{SOURCE_DIRNAME}"
    steps = ["ENV LANG=C.UTF-8 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONUNBUFFERED=1"]
    if with_chromium:
        # Debian's chromium, never Playwright's own browser download (not reproducible, and refused offline).
        steps.append("RUN apt-get update && apt-get install -y --no-install-recommends chromium "
                     "&& rm -rf /var/lib/apt/lists/*")
    target = f".[{extra}]" if extra else "."
    constraints = "-c constraints.txt " if with_constraints else ""
    steps += [
        f"WORKDIR {project}",
        f"COPY {SOURCE_DIRNAME}/ {project}",
        "RUN python -m pip install --upgrade pip "
        f"&& python -m pip install --no-cache-dir {constraints}-e '{target}'",
    ]
    return steps


def stage_source(repo_root: pathlib.Path, dest_parent: pathlib.Path) -> pathlib.Path:
    """Copies the repo as git sees it (tracked + untracked-not-ignored, so no .venv) to dest_parent/rmsweb.

    xmanager copies the whole `path` it is given into the image's build context; giving it the
    checkout would ship .venv and caches (gigabytes).
    """
    listing = subprocess.run(["git", "-C", str(repo_root), "ls-files", "-z", "--cached", "--others",
                              "--exclude-standard"], check=True, capture_output=True, timeout=60).stdout
    dest = dest_parent / SOURCE_DIRNAME
    for rel in filter(None, listing.decode().split("\0")):
        src = repo_root / rel
        if src.is_file():  # a tracked file deleted in the working tree is skipped
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    if not (dest / "setup.py").is_file():
        raise FileNotFoundError(f"{repo_root} staged without setup.py: is it the rmsweb_jax checkout?")
    return dest
