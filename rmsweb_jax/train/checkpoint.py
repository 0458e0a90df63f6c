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

A checkpoint is checked on restore, because Orbax's commit marker says a write finished, not that its
bytes still read back (a file truncated or flipped afterwards restores silently wrong, or fails deep in
tensorstore). Each save records a fingerprint of the state in its metadata: per array, a position-weighted
sum of its bits, computed on device (a reduction: no copy to the host, no reread of the files). A restore
that cannot read a file, or whose arrays' fingerprint differs, raises CheckpointDamaged; `quarantine(step)`
moves such a checkpoint to <directory>/quarantine/<step>-<UTC time>/ (kept for a post-mortem, out of
Orbax's sight). A checkpoint whose tree, shapes or dtypes differ from this run's is not damaged but another
run's: that stays a ValueError naming the leaves.

Orbax logs ~20 INFO lines per save through absl; they are dropped (warnings and errors pass) unless
RMSWEB_ORBAX_INFO=1 is set, so the progress bar and metrics stay readable.
"""
from __future__ import annotations

import base64
import contextlib
import dataclasses
import errno
import datetime
import logging
import os
import pathlib
import sys
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from jax.experimental import multihost_utils
from orbax.checkpoint import type_handlers

from rmsweb_jax import storage
from rmsweb_jax.errors import UserError, disk_full

REPLICA_PARALLEL_MIN_BYTES = 16 << 20
QUARANTINE = "quarantine"  # <directory>/quarantine/<step>-<UTC time>/: damaged checkpoints, set aside
FINGERPRINT_KEY = "state_fingerprint"  # in a checkpoint's meta: fingerprint(state) at save time


class CheckpointDamaged(Exception):
    """A finished checkpoint whose files do not read back as they were written (the message says how)."""


class _OrbaxInfoFilter(logging.Filter):
    """Drops Orbax's INFO (and below) records from the absl logger, and its writer threads' tracebacks of a full
    disk (the save or wait that meets it raises OSError ENOSPC, which main prints as one line); keeps the rest."""

    def filter(self, record: logging.LogRecord) -> bool:
        if f"{os.sep}orbax{os.sep}" not in record.pathname:
            return True
        if record.exc_info and record.exc_info[1] is not None and disk_full(record.exc_info[1]) is not None:
            return False
        return record.levelno > logging.INFO or os.environ.get("RMSWEB_ORBAX_INFO") == "1"


def _closed_loop(err: BaseException | None) -> bool:
    return isinstance(err, RuntimeError) and str(err) == "Event loop is closed"


def _quiet_orbax() -> None:
    logger = logging.getLogger("absl")
    if not any(isinstance(f, _OrbaxInfoFilter) for f in logger.filters):
        logger.addFilter(_OrbaxInfoFilter())
    # An Orbax writer whose first write failed (a full disk) closes its event loop while its other tensorstore writes
    # are still running; each then fails to report back, and tensorstore prints that through sys.excepthook (or, from
    # pybind11, sys.unraisablehook). The first failure is the one the save raises.
    if not getattr(sys.excepthook, "rmsweb_drops_closed_loops", False):
        previous = sys.excepthook

        def hook(kind, value, traceback):
            if not _closed_loop(value):
                previous(kind, value, traceback)
        hook.rmsweb_drops_closed_loops = True
        sys.excepthook = hook
    if not getattr(sys.unraisablehook, "rmsweb_drops_closed_loops", False):  # the same, reported as unraisable
        previous_unraisable = sys.unraisablehook

        def unraisable_hook(unraisable):
            if not _closed_loop(unraisable.exc_value):
                previous_unraisable(unraisable)
        unraisable_hook.rmsweb_drops_closed_loops = True
        sys.unraisablehook = unraisable_hook


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
            raise UserError(f"config.train.checkpoint.every_steps = {every_steps}: expected an integer >= 1")
        if keep < 1:
            raise UserError(f"config.train.checkpoint.keep = {keep}: expected an integer >= 1")
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
        meta = {**(meta or {}), FINGERPRINT_KEY: fingerprint(state)}
        args = ocp.args.Composite(state=ocp.args.PyTreeSave(state),
                                  data=ocp.args.JsonSave(_encode(data_state)),
                                  meta=ocp.args.JsonSave(meta))
        with self._writing(f"checkpoint {step} in {self.directory}"):
            self._manager.save(step, args=args, force=True)

    def restore(self, abstract_state, step: int | None = None) -> Restored:
        """Returns checkpoint `step` (default: the latest), arrays placed like `abstract_state`'s shardings;
        CheckpointDamaged when its files do not read back as saved, ValueError when it is another run's
        (tree, shapes or dtypes differ)."""
        step = self.latest_step() if step is None else step
        if step is None:
            raise FileNotFoundError(f"no finished checkpoint in {self.directory}")
        self._check_matches(step, abstract_state)
        restore_args = ocp.checkpoint_utils.construct_restore_args(abstract_state)
        args = ocp.args.Composite(state=ocp.args.PyTreeRestore(abstract_state, restore_args=restore_args),
                                  data=ocp.args.JsonRestore(), meta=ocp.args.JsonRestore())
        failure = None
        try:
            out = self._manager.restore(step, args=args)
            data_state, meta = _decode(out.data), dict(out.meta or {})
        except Exception as e:  # the tree, shapes and dtypes matched above: what fails now is the bytes
            failure = e
        if _any_process(failure is not None):  # every process reads its own shards: all give up on it together
            raise CheckpointDamaged(f"checkpoint {self.directory / str(step)} does not read back: "
                                    + (_one_line(failure) if failure else "another process could not read it")
                                    ) from failure
        saved, now = meta.pop(FINGERPRINT_KEY, None), fingerprint(out.state)
        if saved is not None and saved != now:  # older checkpoints carry none
            bad = sum(a != b for a, b in zip(saved, now)) + abs(len(saved) - len(now))
            raise CheckpointDamaged(f"checkpoint {self.directory / str(step)} does not read back as saved: "
                                    f"{bad} of {len(saved)} arrays differ from their fingerprint at save time")
        return Restored(step, out.state, data_state, meta)

    def quarantine(self, step: int) -> Any:
        """Returns where checkpoint `step` went, having moved it to <directory>/quarantine/<step>-<UTC time>/."""
        stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
        target = self.directory / QUARANTINE / f"{step}-{stamp}"
        storage.move_tree(self.directory / str(step), target)
        self._manager.reload()  # its list of steps was read at start
        return target

    def reload(self) -> None:
        """Re-reads the list of finished checkpoints (another process moved one)."""
        self._manager.reload()

    def quarantined(self) -> list[str]:
        """Returns the names (<step>-<UTC time>) of the checkpoints set aside in <directory>/quarantine/, by step."""
        folder = self.directory / QUARANTINE
        names = [p.name for p in folder.iterdir()] if folder.is_dir() else []
        return sorted(names, key=lambda name: (int(name.split("-")[0]) if name.split("-")[0].isdigit() else -1, name))

    def _check_matches(self, step: int, abstract_state) -> None:
        """Raises naming the first leaves whose shape or dtype differ between checkpoint `step` and the target;
        CheckpointDamaged when its metadata does not read."""
        try:
            stored = _leaf_table(self._manager.item_metadata(step)["state"])
        except Exception as e:  # a missing or garbled _METADATA: nothing of this checkpoint can be trusted
            raise CheckpointDamaged(f"checkpoint {self.directory / str(step)}: its metadata does not read: "
                                    f"{_one_line(e)}") from e
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
        """Returns the metadata of checkpoint `step` (default: the latest) without touching arrays;
        CheckpointDamaged when it does not read."""
        step = self.latest_step() if step is None else step
        if step is None:
            raise FileNotFoundError(f"no finished checkpoint in {self.directory}")
        try:
            out = self._manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))
            return dict(out.meta or {})
        except Exception as e:  # JSON cut short or garbled, a file gone
            raise CheckpointDamaged(f"checkpoint {self.directory / str(step)}: its metadata does not read: "
                                    f"{_one_line(e)}") from e

    def wait(self) -> None:
        """Blocks until pending asynchronous saves have finished."""
        with self._writing(f"a checkpoint in {self.directory}"):
            self._manager.wait_until_finished()

    def close(self) -> None:
        """Waits for pending saves and releases the manager."""
        try:
            self.wait()
        finally:
            self._manager.close()

    @contextlib.contextmanager
    def _writing(self, what: str):
        """Turns a full disk met by an Orbax writer (its own error types, often without a file name) into an OSError
        naming `what` it was writing and how much a checkpoint here takes; a bucket's quota, into one quoting it."""
        try:
            yield
        except Exception as err:
            full = disk_full(err)
            if full is None:
                raise
            if storage.is_remote(self.directory):
                raise OSError(errno.EDQUOT, f"the bucket refused {what}: {full}") from err
            size = self._checkpoint_bytes()
            needs = f" (a checkpoint here takes {size / 2**20:,.1f} MiB)" if size else ""
            raise OSError(errno.ENOSPC, f"No space left on device writing {what}{needs}") from err

    def _checkpoint_bytes(self) -> int:
        """Returns the size of the newest finished checkpoint on a local disk (0 on a bucket or when none)."""
        step = self._manager.latest_step()
        if step is None or storage.is_remote(self.directory):
            return 0
        return sum(f.stat().st_size for f in pathlib.Path(self.directory, str(step)).rglob("*") if f.is_file())

    def __enter__(self) -> "Checkpointer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def fingerprint(state) -> list[int]:
    """Returns one uint32 per array leaf of `state`: the sum over its elements of (bits as uint32) * (a multiplier
    that depends on the position), mod 2**32, computed on device. A changed, swapped or zeroed element changes it."""
    return [int(x) for x in jax.device_get(_fingerprint_leaves(jax.tree.leaves(state)))]


@jax.jit
def _fingerprint_leaves(leaves):
    def one(x):
        x = jnp.asarray(x)
        if jnp.issubdtype(x.dtype, jax.dtypes.prng_key):
            x = jax.random.key_data(x)
        width = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32}[x.dtype.itemsize] if x.dtype != jnp.bool_ else None
        bits = x.astype(jnp.uint32) if width is None else jax.lax.bitcast_convert_type(x, width).astype(jnp.uint32)
        position = jax.lax.iota(jnp.uint32, bits.size).reshape(bits.shape)
        return jnp.sum(bits * (position * np.uint32(2654435761) + np.uint32(1)), dtype=jnp.uint32)
    return [one(x) for x in leaves]


def _any_process(flag: bool) -> bool:
    """Returns whether `flag` holds on any process (a collective on a multi-host run; `flag` itself on one)."""
    if jax.process_count() == 1:
        return flag
    return bool(np.asarray(multihost_utils.process_allgather(np.int32(flag))).any())


def _one_line(err: BaseException) -> str:
    """Returns the root cause of an error (type and message) on one line, cut to 300 characters: Orbax wraps
    tensorstore's own error ('OUT_OF_RANGE: Error reading "w/0.0" ...') in pages of its spec."""
    seen = {id(err)}
    while (inner := err.__cause__ or err.__context__) is not None and id(inner) not in seen:
        err = inner
        seen.add(id(err))
    text = " ".join(f"{type(err).__name__}: {err}".split())
    return text if len(text) <= 300 else text[:297] + "..."


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
