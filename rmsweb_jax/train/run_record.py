"""What a training run was: its resolved config and identity, written where a reader of its curves looks.

The identity is the git commit of the code (and whether the checkout had uncommitted changes), the versions of
the packages that decide the numbers, the devices, the process count and the mesh. The Trainer's writing process
records both once per start (a resumed run records again: its code or devices may have changed):
- <workdir>/config.json: the resolved config, as rmsweb_jax/stages/pipeline.py writes it, plus "run_identity" (of
  the latest training stage: its "stage" says which);
- TensorBoard (the stage's tensorboard/ folder): the config and the identity as text (TEXT tab), and the flattened
  config as hparams (HPARAMS tab), so runs can be told apart and compared there;
- Weights & Biases when config.train.metrics.wandb names a project (`pip install rmsweb_jax[wandb]`): the same
  config and identity as the run's config, the scalars as they are written. WANDB_MODE=offline keeps the run on
  disk (wandb sync uploads it later).
"""
from __future__ import annotations

import datetime
import importlib.metadata
import json
import pathlib
import platform
import subprocess
from typing import Any

import jax

from rmsweb_jax import storage
from rmsweb_jax.errors import UserError
from rmsweb_jax.tensorboardx_import import tensorboardx

# The packages whose versions can change a run's numbers or its files.
PACKAGES = ("rmsweb_jax", "jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "numpy", "ml_collections",
            "transformers", "grain", "tensorboardX")
REPO = pathlib.Path(__file__).resolve().parents[2]


def run_identity(mesh=None, *, stage: str = "") -> dict[str, Any]:
    """Returns the run's identity: code commit, package versions, devices, processes and mesh."""
    devices = jax.devices()
    return {
        "stage": stage,
        "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "git_commit": _git("rev-parse", "HEAD"),
        "git_dirty": bool(_git("status", "--porcelain", "--untracked-files=no")),
        "python": platform.python_version(),
        "host": platform.node(),
        "versions": {name: _version(name) for name in PACKAGES},
        "devices": {"platform": devices[0].platform, "kind": devices[0].device_kind, "count": len(devices),
                    "local_count": jax.local_device_count(), "processes": jax.process_count()},
        "mesh": None if mesh is None else {str(k): int(v) for k, v in mesh.shape.items()},  # None: one device
    }


def _git(*args: str) -> str:
    """Returns git's answer in the package's checkout ("" when it is not one, e.g. an installed wheel)."""
    try:
        done = subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout.strip() if done.returncode == 0 else ""


def _version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def flat_config(config) -> dict[str, Any]:
    """Returns the config's leaves as {"train.optimizer.lr": 1e-05, ...}: numbers, strings and bools as they are,
    anything else (tuples, None) as its repr, which is what hparams accept."""
    out: dict[str, Any] = {}

    def walk(node, prefix):
        if hasattr(node, "keys"):
            for key in node.keys():
                walk(node[key], f"{prefix}.{key}" if prefix else str(key))
        else:
            out[prefix] = node if isinstance(node, (bool, int, float, str)) else repr(node)
    walk(config, "")
    return out


def write_config_json(workdir, config, identity: dict) -> None:
    """Adds "run_identity" to <workdir>/config.json, the resolved config the pipeline wrote there (a Trainer run
    outside the pipeline: `config` with it). The pipeline's copy is kept as it is: a stage's own variant of the
    config (Salvage-DS's train block) goes to the stage's TensorBoard, not over the run's config."""
    path = storage.as_path(workdir) / "config.json"
    try:
        record = json.loads(path.read_text())
    except FileNotFoundError:
        record = json.loads(config.to_json_best_effort())
    record["run_identity"] = identity
    storage.write_text_atomic(path, json.dumps(record, indent=2))


def write_tensorboard(directory: pathlib.Path, config, identity: dict) -> None:
    """Writes the config and identity as text, and the flattened config as hparams, to an event file of its own in
    `directory` (the metrics writer's tensorboard/ folder: one run in TensorBoard, uploaded with it on a bucket)."""
    tbx = tensorboardx()  # the package first, without torch (tensorboardx_import.py)
    with tbx.SummaryWriter(str(directory), filename_suffix=".run") as writer:
        writer.add_text("run/config", "```\n" + config.to_json_best_effort(indent=2) + "\n```", 0)
        writer.add_text("run/identity", "```\n" + json.dumps(identity, indent=2) + "\n```", 0)
        values = {**flat_config(config), "git_commit": identity["git_commit"], "devices": identity["devices"]["count"]}
        # The HPARAMS tab's columns, train/loss its metric.
        for summary in tbx.summary.hparams(values, {"train/loss": None}):
            writer.file_writer.add_summary(summary)


class WandbRun:
    """A Weights & Biases run for config.train.metrics.wandb = project ("" = none): the config and identity as its
    config, each write()'s scalars logged at their step. Only the writing process opens one."""

    def __init__(self, project: str, *, name: str, directory: pathlib.Path, config, identity: dict):
        try:
            import wandb  # an extra: pip install rmsweb_jax[wandb]
        except ImportError as err:
            raise UserError(f"config.train.metrics.wandb = {project!r}: the wandb package is not installed (pip "
                            "install 'rmsweb_jax[wandb]'), or set it to '' to log to TensorBoard alone") from err
        directory.mkdir(parents=True, exist_ok=True)
        self._run = wandb.init(project=project, name=name, dir=str(directory),
                               config={"config": json.loads(config.to_json_best_effort()), "run_identity": identity})

    @property
    def directory(self) -> pathlib.Path:
        """The run's local folder (WANDB_MODE=offline: what `wandb sync` uploads)."""
        return pathlib.Path(self._run.dir).parent

    def log(self, step: int, scalars: dict[str, float]) -> None:
        self._run.log({f"train/{k}": v for k, v in scalars.items()}, step=step)

    def close(self) -> None:
        if self._run is not None:
            self._run.finish()
            self._run = None
