"""Orbax checkpoints of a training run: train state, data-iterator state and run metadata, per step.

Layout: <directory>/<step>/{state, data, meta}. `state` is the TrainState pytree (sharded arrays,
restored straight onto the target shardings); `data` is the data pipeline's opaque iterator state
(a JSON value, or bytes stored base64); `meta` is JSON (the model config, where the run started
from). Saves are asynchronous (the device-to-host copy happens before `save` returns, the write
in the background); a step directory appears only once its write has finished, so a killed run
leaves at worst a temporary directory that is ignored and cleaned up on the next start.

Arrays are saved without Orbax's replica-parallel slicing below 16 MiB per slice: that path runs
one eagerly compiled slice per array and device, which made the first save of the tiny model take
~60 s on 8 CPU devices (0.2 s without it); large arrays still split their writes across replicas.

Orbax logs ~20 INFO lines per save through absl; they are dropped (warnings and errors pass) unless
RMSWEB_ORBAX_INFO=1 is set, so the progress bar and metrics stay readable.
"""
from __future__ import annotations

import base64
import dataclasses
import logging
import os
import pathlib
from typing import Any

import jax
import orbax.checkpoint as ocp
from orbax.checkpoint import type_handlers

from rmsweb_jax import storage

REPLICA_PARALLEL_MIN_BYTES = 16 << 20


class _OrbaxInfoFilter(logging.Filter):
    """Drops Orbax's INFO (and below) records from the absl logger; keeps everything else."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno > logging.INFO or f"{os.sep}orbax{os.sep}" not in record.pathname


def _quiet_orbax() -> None:
    if os.environ.get("RMSWEB_ORBAX_INFO") == "1":
        return
    logger = logging.getLogger("absl")
    if not any(isinstance(f, _OrbaxInfoFilter) for f in logger.filters):
        logger.addFilter(_OrbaxInfoFilter())


@dataclasses.dataclass(frozen=True)
class Restored:
    """What a checkpoint held: its step, the train state, the data-iterator state and the metadata."""
    step: int
    state: Any
    data_state: Any
    meta: dict


class Checkpointer:
    """Saves every `every_steps` steps (plus forced saves), keeps the newest `keep`, restores the latest."""

    def __init__(self, directory: str | pathlib.Path, *, every_steps: int, keep: int, async_save: bool = True):
        _quiet_orbax()
        if every_steps < 1:
            raise ValueError(f"config.train.checkpoint.every_steps = {every_steps}: expected an integer >= 1")
        if keep < 1:
            raise ValueError(f"config.train.checkpoint.keep = {keep}: expected an integer >= 1")
        # Orbax writes a bucket folder itself (tensorstore's GCS driver, etils.epath for its small files).
        self.directory = storage.as_path(directory)
        if not storage.is_remote(self.directory):
            self.directory = self.directory.absolute()
        self.every_steps = every_steps
        arrays = type_handlers.create_type_handler_registry(
            (jax.Array, type_handlers.ArrayHandler(min_slice_bytes_for_replica_parallel=REPLICA_PARALLEL_MIN_BYTES)))
        state_handler = ocp.PyTreeCheckpointHandler(type_handler_registry=arrays)
        registry = ocp.handlers.DefaultCheckpointHandlerRegistry()
        registry.add("state", ocp.args.PyTreeSave, state_handler)
        registry.add("state", ocp.args.PyTreeRestore, state_handler)
        for item in ("data", "meta"):
            json_handler = ocp.JsonCheckpointHandler()
            registry.add(item, ocp.args.JsonSave, json_handler)
            registry.add(item, ocp.args.JsonRestore, json_handler)
        options = ocp.CheckpointManagerOptions(max_to_keep=keep, enable_async_checkpointing=async_save,
                                               cleanup_tmp_directories=True, create=True)
        self._manager = ocp.CheckpointManager(self.directory, options=options, handler_registry=registry)

    def latest_step(self) -> int | None:
        """Returns the newest finished checkpoint's step, or None."""
        return self._manager.latest_step()

    def all_steps(self) -> list[int]:
        """Returns the steps of every finished checkpoint, oldest first."""
        return sorted(self._manager.all_steps())

    def due(self, step: int) -> bool:
        """Returns whether `step` is a regular save step (a multiple of every_steps)."""
        return step > 0 and step % self.every_steps == 0

    def save(self, step: int, state, data_state: Any = None, meta: dict | None = None) -> None:
        """Starts saving `state` (+ iterator state, metadata) as checkpoint `step`; returns once arrays are copied."""
        args = ocp.args.Composite(state=ocp.args.PyTreeSave(state),
                                  data=ocp.args.JsonSave(_encode(data_state)),
                                  meta=ocp.args.JsonSave(meta or {}))
        self._manager.save(step, args=args, force=True)

    def restore(self, abstract_state, step: int | None = None) -> Restored:
        """Returns checkpoint `step` (default: the latest), arrays placed like `abstract_state`'s shardings."""
        step = self.latest_step() if step is None else step
        if step is None:
            raise FileNotFoundError(f"no finished checkpoint in {self.directory}")
        self._check_matches(step, abstract_state)
        restore_args = ocp.checkpoint_utils.construct_restore_args(abstract_state)
        args = ocp.args.Composite(state=ocp.args.PyTreeRestore(abstract_state, restore_args=restore_args),
                                  data=ocp.args.JsonRestore(), meta=ocp.args.JsonRestore())
        try:
            out = self._manager.restore(step, args=args)
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(f"checkpoint {self.directory / str(step)} does not match this run's train state "
                             f"(model or optimizer config changed?): {e}") from e
        return Restored(step, out.state, _decode(out.data), dict(out.meta or {}))

    def _check_matches(self, step: int, abstract_state) -> None:
        """Raises naming the first leaves whose shape or dtype differ between checkpoint `step` and the target."""
        stored = _leaf_table(self._manager.item_metadata(step)["state"])
        wanted = _leaf_table(abstract_state)
        problems = [f"{k}: missing in the checkpoint" for k in wanted if k not in stored]
        problems += [f"{k}: in the checkpoint only" for k in stored if k not in wanted]
        problems += [f"{k}: checkpoint {stored[k][0]} {stored[k][1]}, this run {wanted[k][0]} {wanted[k][1]}"
                     for k in wanted if k in stored and stored[k] != wanted[k]]
        if problems:
            raise ValueError(f"checkpoint {self.directory / str(step)} does not match this run's train state (model "
                             f"or optimizer config changed?): " + "; ".join(problems[:3])
                             + (f"; and {len(problems) - 3} more" if len(problems) > 3 else ""))

    def read_meta(self, step: int | None = None) -> dict:
        """Returns the metadata of checkpoint `step` (default: the latest) without touching arrays."""
        step = self.latest_step() if step is None else step
        if step is None:
            raise FileNotFoundError(f"no finished checkpoint in {self.directory}")
        out = self._manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))
        return dict(out.meta or {})

    def wait(self) -> None:
        """Blocks until pending asynchronous saves have finished."""
        self._manager.wait_until_finished()

    def close(self) -> None:
        """Waits for pending saves and releases the manager."""
        self._manager.wait_until_finished()
        self._manager.close()

    def __enter__(self) -> "Checkpointer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _leaf_table(tree) -> dict[str, tuple[tuple[int, ...], str]]:
    """Returns {"a/b/0": (shape, dtype name)} for a pytree of arrays or array metadata (containers ignored)."""
    def key(entry):
        for attr in ("key", "name", "idx"):
            if hasattr(entry, attr):
                return str(getattr(entry, attr))
        return str(entry)
    flat = jax.tree_util.tree_flatten_with_path(tree)[0]
    return {"/".join(key(e) for e in path): (tuple(leaf.shape), str(leaf.dtype)) for path, leaf in flat}


def _encode(data_state: Any) -> dict:
    """Returns a JSON value wrapping an iterator state (bytes are base64-encoded)."""
    if isinstance(data_state, (bytes, bytearray)):
        return {"kind": "bytes", "value": base64.b64encode(bytes(data_state)).decode("ascii")}
    return {"kind": "json", "value": data_state}


def _decode(stored: Any) -> Any:
    if not stored:
        return None
    if stored.get("kind") == "bytes":
        return base64.b64decode(stored["value"])
    return stored.get("value")
