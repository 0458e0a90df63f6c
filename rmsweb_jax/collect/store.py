"""The trajectory store: ArrayRecord shards of StepRecords and TrajectoryRecords in one folder.

Layout of a store folder:

    store.json                       {"format": ..., "schema_version": N}
    steps-000001.arrayrecord         StepRecords of every attempt committed in flush 1
    trajectories-000001.arrayrecord  TrajectoryRecords of flush 1: the commit marker
    .lock                            held (flock) by the one writer

A flush writes the steps shard to a hidden temp file, fsyncs and renames it, then does the
same with the trajectories shard. A flush's records exist only once its trajectories shard
exists, so a crash at any point leaves either the whole flush or none of it: a steps shard
without its trajectories shard (and any temp file) is an orphan, removed when a writer opens
the store. Whole task groups (every attempt of one task and seed) go into one flush, so a
resumed collection skips exactly the committed groups: nothing lost, nothing twice.

Shards are written with group_size 1, so Grain's ArrayRecordDataSource reads any record
directly (see sft_view.SFTView for the training view).
"""
from __future__ import annotations

import dataclasses
import fcntl
import json
import os
import pathlib
import re
import time
from typing import Iterable, Iterator, Sequence

from array_record.python.array_record_module import ArrayRecordReader, ArrayRecordWriter

from rmsweb_jax.collect.records import SCHEMA_VERSION, StepRecord, TrajectoryRecord

STORE_FILE = "store.json"
STORE_FORMAT = "rmsweb trajectory store"
LOCK_FILE = ".lock"
STEPS, TRAJECTORIES = "steps", "trajectories"
SUFFIX = ".arrayrecord"
TMP_PREFIX = ".tmp-"
# group_size 1: every record is its own chunk, as random access (Grain) wants. zstd is cheap on
# CPU and the PNG bytes inside do not compress further anyway.
WRITER_OPTIONS = "group_size:1,zstd:3"
_SHARD = re.compile(rf"^({STEPS}|{TRAJECTORIES})-(\d{{6}}){re.escape(SUFFIX)}$")

Attempt = tuple[TrajectoryRecord, Sequence[StepRecord]]


class StoreError(RuntimeError):
    """A store folder that cannot be used as asked (missing, empty, another schema, locked)."""


def shard_name(kind: str, seq: int) -> str:
    """Returns the file name of flush `seq`'s shard of `kind` ("steps" or "trajectories")."""
    return f"{kind}-{seq:06d}{SUFFIX}"


class TrajectoryStore:
    """Reads a store folder: committed trajectories, the steps of each, counts.

        store = TrajectoryStore("workdir/store")
        for traj in store.trajectories():
            steps = store.steps(traj)

    Only committed flushes are visible; a writer working in the same folder is not disturbed.
    """

    def __init__(self, directory: str | os.PathLike):
        self.directory = pathlib.Path(directory)
        meta_path = self.directory / STORE_FILE
        if not meta_path.is_file():
            raise StoreError(f"no trajectory store at {self.directory} (missing {STORE_FILE})")
        try:
            meta = json.loads(meta_path.read_text())
        except ValueError as e:
            raise StoreError(f"{meta_path} is not JSON: {e}") from None
        if meta.get("schema_version") != SCHEMA_VERSION:
            raise StoreError(f"store {self.directory} has schema version {meta.get('schema_version')!r}; "
                             f"this code reads version {SCHEMA_VERSION}")
        self._readers: dict[str, ArrayRecordReader] = {}

    # --- shards -------------------------------------------------------------------------
    def committed_flushes(self) -> list[int]:
        """Returns the sequence numbers of committed flushes (those with a trajectories shard)."""
        return sorted(seq for kind, seq in self._shards() if kind == TRAJECTORIES)

    def trajectory_shards(self) -> list[pathlib.Path]:
        """Returns the committed trajectories shards, oldest first."""
        return [self.directory / shard_name(TRAJECTORIES, s) for s in self.committed_flushes()]

    def step_shards(self) -> list[pathlib.Path]:
        """Returns the committed steps shards, oldest first (a flush of only step-less attempts
        has none)."""
        committed = set(self.committed_flushes())
        return [self.directory / shard_name(STEPS, s) for kind, s in sorted(self._shards(), key=lambda x: x[1])
                if kind == STEPS and s in committed]

    def _shards(self) -> list[tuple[str, int]]:
        found = []
        for entry in os.listdir(self.directory):
            m = _SHARD.match(entry)
            if m:
                found.append((m.group(1), int(m.group(2))))
        return found

    # --- records ------------------------------------------------------------------------
    def trajectories(self) -> Iterator[TrajectoryRecord]:
        """Yields every committed TrajectoryRecord, in commit order."""
        for path in self.trajectory_shards():
            for data in self._reader(path).read_all():
                yield TrajectoryRecord.from_bytes(data)

    def steps(self, trajectory: TrajectoryRecord) -> list[StepRecord]:
        """Returns the StepRecords of `trajectory`, in step order."""
        if trajectory.num_steps == 0:
            return []
        path = self.directory / trajectory.steps_shard
        if not path.is_file():
            raise StoreError(f"steps shard {path} of {trajectory.request_id} is missing")
        positions = list(range(trajectory.steps_start, trajectory.steps_start + trajectory.num_steps))
        steps = [StepRecord.from_bytes(d) for d in self._reader(path).read(positions)]
        for i, step in enumerate(steps):
            if step.request_id != trajectory.request_id or step.step != i:
                raise StoreError(f"{path} position {positions[i]}: expected step {i} of {trajectory.request_id}, "
                                 f"found step {step.step} of {step.request_id}")
        return steps

    def groups(self) -> dict[tuple[str, int], list[TrajectoryRecord]]:
        """Returns {(task id, seed): its attempts in attempt order} over committed records."""
        groups: dict[tuple[str, int], list[TrajectoryRecord]] = {}
        for traj in self.trajectories():
            groups.setdefault(traj.key, []).append(traj)
        return {k: sorted(v, key=lambda t: t.attempt) for k, v in groups.items()}

    def finished_task_keys(self) -> set[tuple[str, int]]:
        """Returns the (task id, seed) of every committed task group."""
        return {traj.key for traj in self.trajectories()}

    def counts(self) -> dict[str, int]:
        """Returns {"tasks", "trajectories", "successful_trajectories", "steps", "flushes"}."""
        trajs = list(self.trajectories())
        return {"tasks": len({t.key for t in trajs}), "trajectories": len(trajs),
                "successful_trajectories": sum(t.success for t in trajs), "steps": sum(t.num_steps for t in trajs),
                "flushes": len(self.committed_flushes())}

    def _reader(self, path: pathlib.Path) -> ArrayRecordReader:
        key = str(path)
        if key not in self._readers:
            self._readers[key] = ArrayRecordReader(key)
        return self._readers[key]

    def close(self) -> None:
        """Closes the open shard readers (the store stays usable; readers reopen on demand)."""
        readers, self._readers = self._readers, {}
        for reader in readers.values():
            reader.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class StoreWriter(TrajectoryStore):
    """Appends task groups to a store folder (creating it), committing several groups per flush.

        with StoreWriter("workdir/store", flush_every_tasks=8) as store:
            todo = [k for k in keys if k not in store.finished_task_keys()]
            store.add_group([(trajectory, steps), ...])   # every attempt of one task and seed

    Opening removes what a crashed writer left half-done. Groups wait in memory until
    `flush_every_tasks` groups are buffered or the oldest has waited `flush_every_s`; close()
    (also on an exception) commits what is buffered. One writer per folder (an flock).
    """

    def __init__(self, directory: str | os.PathLike, *, flush_every_tasks: int = 8, flush_every_s: float = 30.0):
        if flush_every_tasks < 1:
            raise ValueError(f"flush_every_tasks must be >= 1, got {flush_every_tasks!r}")
        if flush_every_s < 0:
            raise ValueError(f"flush_every_s must be >= 0, got {flush_every_s!r}")
        directory = pathlib.Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        self._lock = open(directory / LOCK_FILE, "a")
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock.close()
            raise StoreError(f"another process is writing to the store at {directory} (it holds {LOCK_FILE})") from None
        try:
            if not (directory / STORE_FILE).exists():
                _write_atomic(directory / STORE_FILE, json.dumps(
                    {"format": STORE_FORMAT, "schema_version": SCHEMA_VERSION, "created": time.time()}).encode())
            super().__init__(directory)
            self.removed_orphans = self._remove_orphans()
        except BaseException:
            self._lock.close()
            raise
        self.flush_every_tasks = flush_every_tasks
        self.flush_every_s = flush_every_s
        self._committed = TrajectoryStore.finished_task_keys(self)
        self._buffer: list[list[Attempt]] = []
        self._buffered_since: float | None = None
        self._next_seq = max(self.committed_flushes(), default=0) + 1

    def _remove_orphans(self) -> list[str]:
        # Temp files and steps shards whose trajectories shard never landed: a crashed flush.
        committed = set(self.committed_flushes())
        removed = []
        for entry in sorted(os.listdir(self.directory)):
            m = _SHARD.match(entry)
            if entry.startswith(TMP_PREFIX) or (m and m.group(1) == STEPS and int(m.group(2)) not in committed):
                (self.directory / entry).unlink()
                removed.append(entry)
        if removed:
            _fsync_dir(self.directory)
        return removed

    def finished_task_keys(self) -> set[tuple[str, int]]:
        """Returns the (task id, seed) of every committed or buffered task group."""
        return self._committed | {group[0][0].key for group in self._buffer}

    @property
    def buffered_tasks(self) -> int:
        """Returns the number of task groups waiting for the next flush."""
        return len(self._buffer)

    def add_group(self, attempts: Sequence[Attempt]) -> bool:
        """Buffers one task group — every attempt (trajectory, its steps) of one task and seed —
        and flushes when due; returns whether it flushed. Raises ValueError for a group that is
        inconsistent or already in the store."""
        attempts = [(traj, tuple(steps)) for traj, steps in attempts]
        _check_group(attempts)
        key = attempts[0][0].key
        if key in self.finished_task_keys():
            raise ValueError(f"task group {key} is already in the store at {self.directory}")
        self._buffer.append(attempts)
        if self._buffered_since is None:
            self._buffered_since = time.monotonic()
        return self.maybe_flush()

    def maybe_flush(self) -> bool:
        """Flushes when `flush_every_tasks` groups are buffered or the oldest has waited
        `flush_every_s` seconds; returns whether it flushed."""
        if not self._buffer:
            return False
        if len(self._buffer) >= self.flush_every_tasks or time.monotonic() - self._buffered_since >= self.flush_every_s:
            self.flush()
            return True
        return False

    def flush(self) -> None:
        """Commits every buffered group as one flush (steps shard, then trajectories shard)."""
        if not self._buffer:
            return
        seq = self._next_seq
        steps_name = shard_name(STEPS, seq)
        trajectories, steps = [], []
        for group in self._buffer:
            for traj, traj_steps in group:
                trajectories.append(_located(traj, steps_name if traj_steps else "", len(steps)))
                steps.extend(traj_steps)
        if steps:
            _write_shard(self.directory / steps_name, (s.to_bytes() for s in steps))
        _write_shard(self.directory / shard_name(TRAJECTORIES, seq), (t.to_bytes() for t in trajectories))
        _fsync_dir(self.directory)
        self._committed |= {group[0][0].key for group in self._buffer}
        self._buffer, self._buffered_since = [], None
        self._next_seq = seq + 1

    def close(self) -> None:
        """Commits what is buffered, closes readers and releases the writer lock (idempotent)."""
        try:
            if not self._lock.closed:
                self.flush()
        finally:
            super().close()
            if not self._lock.closed:
                self._lock.close()


def _located(traj: TrajectoryRecord, shard: str, start: int) -> TrajectoryRecord:
    return dataclasses.replace(traj, steps_shard=shard, steps_start=start if shard else 0)


def _check_group(attempts: list[Attempt]) -> None:
    if not attempts:
        raise ValueError("a task group needs at least one attempt")
    key = attempts[0][0].key
    for i, (traj, steps) in enumerate(attempts, start=1):
        if traj.key != key:
            raise ValueError(f"attempt {traj.request_id} belongs to {traj.key}, not to the group's {key}")
        if traj.attempt != i:
            raise ValueError(f"group {key}: attempt {i} is numbered {traj.attempt} ({traj.request_id})")
        if traj.num_steps != len(steps):
            raise ValueError(f"{traj.request_id}: num_steps is {traj.num_steps} but {len(steps)} steps were given")
        for j, step in enumerate(steps):
            if step.request_id != traj.request_id or step.step != j:
                raise ValueError(f"{traj.request_id}: step {j} is step {step.step} of {step.request_id}")


def _write_shard(path: pathlib.Path, records: Iterable[bytes]) -> None:
    tmp = path.with_name(TMP_PREFIX + path.name)
    writer = ArrayRecordWriter(str(tmp), WRITER_OPTIONS)
    try:
        for data in records:
            writer.write(data)
        if not writer.ok():
            raise OSError(f"writing shard {tmp} failed")
    finally:
        writer.close()
    fd = os.open(tmp, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def _write_atomic(path: pathlib.Path, data: bytes) -> None:
    tmp = path.with_name(TMP_PREFIX + path.name)
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def _fsync_dir(directory: pathlib.Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
