"""The parts of the xmanager launcher that need no xmanager: accelerators and the Vertex AI machine types
they need, job arguments and config overrides checked against the config, the image.

`launch/xm_launch.py` turns these into xm objects; keeping them here lets the project's own venv
(which cannot hold xmanager: it pins protobuf < 7) test them.
"""
from __future__ import annotations

import dataclasses
import difflib
import pathlib
import re
import reprlib
import shutil
import subprocess
import sys

import ml_collections
from absl import flags
from ml_collections import config_flags


@dataclasses.dataclass(frozen=True)
class Accelerator:
    """One accelerator choice: its xm resource name, the pip extra it needs, how its topology reads, and
    the Vertex AI machine type for each GPU count Vertex offers it in."""
    xm_resource: str | None   # key for xm.JobRequirements (None: CPU only)
    extra: str                # setup.py extra ('' = the base install)
    topology_dims: int        # TPU: 2 ('4x4') or 3 ('2x2x2'); GPU/CPU: 0 (a plain count)
    vertex_machines: dict[int, str]  # GPU count -> Vertex machine type ({}: not a Vertex GPU)


def _gpu_machines(family: str, counts: tuple[int, ...]) -> dict[int, str]:
    return {n: f"{family}-{n}g" for n in counts}


# Vertex AI attaches GPUs only to the machine type built for them, with exactly its count (A2: A100,
# A3: H100/H200). xmanager 0.8.5 maps only A100 40GB (and L4) to these; every other GPU falls through to
# its CPU table, n1-standard-4, which Vertex refuses with H100s attached: the launcher sets the type itself.
ACCELERATORS = {
    "cpu": Accelerator(None, "", 0, {}),
    "tpu_v5e": Accelerator("tpu_v5e", "tpu", 2, {}),
    "tpu_v5p": Accelerator("tpu_v5p", "tpu", 3, {}),
    "tpu_v6e": Accelerator("tpu_v6e", "tpu", 2, {}),
    "tpu_v4": Accelerator("tpu_v4", "tpu", 3, {}),
    "a100": Accelerator("a100", "gpu", 0, {**_gpu_machines("a2-highgpu", (1, 2, 4, 8)), 16: "a2-megagpu-16g"}),
    "a100_80gb": Accelerator("a100_80gib", "gpu", 0, _gpu_machines("a2-ultragpu", (1, 2, 4, 8))),
    "h100": Accelerator("h100", "gpu", 0, _gpu_machines("a3-highgpu", (1, 2, 4, 8))),
    "h200": Accelerator("h200", "gpu", 0, {8: "a3-ultragpu-8g"}),
    "local_gpu": Accelerator("local_gpu", "gpu", 0, {}),
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


def vertex_machine_type(name: str, topology: str) -> str | None:
    """Returns the Vertex AI machine type for `topology` GPUs of accelerator `name`; None for CPU and TPU
    jobs (xmanager sizes CPU machines itself; xm_launch checks which TPUs its Vertex backend places)."""
    acc = accelerator(name)
    if name == "local_gpu":
        raise ValueError("--accelerator=local_gpu is for --backend=local; on Vertex name the GPU: "
                         f"{', '.join(n for n, a in ACCELERATORS.items() if a.vertex_machines)}")
    if not acc.vertex_machines:
        return None
    count = chip_count(topology)
    if count not in acc.vertex_machines:
        offered = ", ".join(f"{n} ({machine})" for n, machine in acc.vertex_machines.items())
        raise ValueError(f"--accelerator={name} --topology={topology}: Vertex AI offers {name} only in "
                         f"machines of {offered} GPUs")
    return acc.vertex_machines[count]


def vertex_scheduling(spot: bool, restarts: bool) -> dict[str, object]:
    """Returns the scheduling arguments of Vertex AI's CustomJob.submit for a job on spot VMs or not, restarted or
    not when Vertex restarts a worker (a preempted spot VM, a maintenance event). A restarted job reruns the same
    command, which resumes from its workdir (the checkpoint SIGTERM saved). The strategy is the enum's name."""
    return {"restart_job_on_worker_restart": restarts, "scheduling_strategy": "SPOT" if spot else None}


def describe_scheduling(scheduling: dict[str, object]) -> str:
    """Returns vertex_scheduling's arguments in words, for the dry run."""
    vms = "spot VMs" if scheduling["scheduling_strategy"] == "SPOT" else "on-demand VMs"
    if scheduling["restart_job_on_worker_restart"]:
        return f"{vms}; a restarted worker (preemption) restarts the job, which resumes from its workdir"
    return f"{vms}; a restarted worker (preemption) ends the job (--norestart_on_preemption)"


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
        key, value = split_override(item)
        args.append(f"--config.{key}={value}")
    return args


def split_override(item: str) -> tuple[str, str]:
    """Returns (dotted config key, value) of an override written KEY=VALUE or --config.KEY=VALUE."""
    key, sep, value = item.partition("=")
    key = key.removeprefix("--").removeprefix("config.")
    if not sep or not re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*", key):
        raise ValueError(f"--override={item!r}: expected KEY=VALUE with a dotted config key, e.g. model.init=hf:/ckpt")
    return key, value


def check_overrides(repo_root: pathlib.Path, config: str, overrides: list[str]) -> dict[str, object]:
    """Returns {key: value as the job will see it} for each override, parsed against the config file the way
    rmsweb_jax.main parses them (ml_collections config_flags); an unknown key or a value of the wrong type
    raises ValueError naming the override, and for an unknown key the nearest known keys."""
    path, sep, arg = config.partition(":")
    config_file = repo_root / path
    if not config_file.is_file():
        raise ValueError(f"--config={config}: no file {config_file}")
    located = f"{config_file}{sep}{arg}"
    # The configs import rmsweb_jax (main runs from the repo root); `xmanager launch` drops the root it put
    # on sys.path once it has imported the launch script.
    if str(repo_root) not in sys.path:
        sys.path.insert(0, str(repo_root))
    try:
        base = _load_config(located, [])
    except ImportError as err:  # the launcher's venv holds ml_collections and jax, not every project dependency
        raise ValueError(f"--config={config}: loading it needs {err.name!r}, which this venv lacks; add it to "
                         "launch/requirements-xm.txt") from err
    known = sorted(config_keys(base))
    parsed = {}
    for item in overrides:
        key, value = split_override(item)
        if key not in known:
            raise ValueError(f"--override={item!r}: {config} has no key {key!r}; nearest known keys: "
                             f"{', '.join(_nearest(key, known))}")
        try:
            loaded = _load_config(located, [f"--config.{key}={value}"])
        except (flags.Error, KeyError, AttributeError, TypeError, ValueError) as err:  # as rmsweb_jax.main
            message = " ".join(str(err).split())
            current = _get(base, key)
            held = ("a group of keys" if isinstance(current, ml_collections.ConfigDict)
                    else f"{type(current).__name__} ({reprlib.repr(current)} in {config})")
            raise ValueError(f"--override={item!r}: {key} is {held} "
                             f"and {value!r} does not parse as one: {message}") from err
        parsed[key] = _get(loaded, key)
    return parsed


def config_keys(config) -> set[str]:
    """Returns every dotted key of a ConfigDict: its leaves and the nested ConfigDicts themselves."""
    keys = set()
    for name, value in config.items():
        keys.add(name)
        if isinstance(value, ml_collections.ConfigDict):
            keys.update(f"{name}.{sub}" for sub in config_keys(value))
    return keys


def _load_config(located: str, overrides: list[str]):
    # Own FlagValues: the launcher's --config flag is a plain string, and main's --config parser reads its
    # --config.KEY overrides from the argv it is given (sys_argv), not from the launcher's command line.
    argv = ["rmsweb_jax.main", f"--config={located}", *overrides]
    values = flags.FlagValues()
    config_flags.DEFINE_config_file("config", None, flag_values=values, sys_argv=argv)
    values(argv)
    return values.config


def _get(config, key: str):
    for part in key.split("."):
        config = config[part]
    return config


def _nearest(key: str, known: list[str]) -> list[str]:
    """Returns up to 5 known keys close to `key`: by spelling, else the keys under its deepest known parent."""
    close = difflib.get_close_matches(key, known, n=5, cutoff=0.6)
    if close:
        return close
    parent = key
    while "." in parent and parent not in known:
        parent = parent.rsplit(".", 1)[0]
    under = [k for k in known if k.startswith(parent + ".")] if parent in known else []
    return under[:5] or [k for k in known if "." not in k][:5]


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
