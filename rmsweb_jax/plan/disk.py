"""What a run will write, against what its workdir's disk has free: main warns before the first stage when the
checkpoints and exports of the training stages it runs would not fit (a full disk later stops the run with one
line, and the rerun resumes, but hours can pass before it does).

A training stage's checkpoints: keep + 1 of them at once (Orbax writes the next before it drops the oldest), each
the parameters and the optimizer state; its HF export: the parameters once more."""
from __future__ import annotations

import pathlib
import shutil

from rmsweb_jax import storage

TRAINING_STAGES = ("train_smoke", "base", "ground", "sft", "salvage")


def checkpoint_bytes(config) -> tuple[int, int]:
    """Returns (one checkpoint's bytes: parameters and optimizer state, the parameters' bytes) of config's model."""
    from rmsweb_jax.plan import memory, planner
    model_config, _ = planner.architecture(config)
    state = memory.state_bytes(model_config, config, memory.abstract_mesh({"data": 1, "fsdp": 1, "tensor": 1}))
    return state["params"] + state["optimizer"], state["params"]


def planned_writes(config, stages) -> dict[str, int]:
    """Returns {training stage: the bytes its checkpoints and export take at most} for the training stages in
    `stages`."""
    training = [s for s in stages if s in TRAINING_STAGES]
    if not training:
        return {}
    checkpoint, params = checkpoint_bytes(config)
    keep = int(config.train.checkpoint.keep)
    return {stage: (keep + 1) * checkpoint + params for stage in training}


def free_bytes(workdir: str) -> int | None:
    """Returns the free bytes on the filesystem that holds (or will hold) `workdir`; None on a bucket."""
    if storage.is_remote(workdir):
        return None
    folder = pathlib.Path(workdir).absolute()
    while not folder.exists():
        folder = folder.parent
    return shutil.disk_usage(folder).free


def space_warning(config, workdir: str, stages) -> str | None:
    """Returns a one-line warning when the training stages in `stages` may write more than `workdir`'s disk has free
    (None when it fits, on a bucket, or when the model's size cannot be known before a stage runs)."""
    free = free_bytes(workdir)
    if free is None:
        return None
    try:
        writes = planned_writes(config, stages)
    except (ValueError, OSError):  # the model comes from a stage not yet run (sft from ground's export)
        return None
    need = sum(writes.values())
    if need <= free:
        return None
    G = 2 ** 30
    parts = ", ".join(f"{stage} {size / G:,.2f} GiB" for stage, size in writes.items())
    return (f"workdir {workdir} has {free / G:,.2f} GiB free, and this run's checkpoints and exports may take "
            f"{need / G:,.2f} GiB ({parts}; config.train.checkpoint.keep = {config.train.checkpoint.keep}): a full "
            "disk stops the run, and the same command resumes it once there is space")
