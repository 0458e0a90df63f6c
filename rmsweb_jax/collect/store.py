"""The trajectory store: ArrayRecord shards of StepRecords and TrajectoryRecords in one folder.

The files are described in store_layout.py. A flush writes the steps shard to a hidden temp
file, fsyncs and renames it, does the same with the trajectories shard, then writes the flush's
commit marker (record counts, sizes and sha256 of both shards, its task groups). A crash at any
point leaves the whole flush or none of it: shards without a marker (and temp files) are the
leftovers of the last flush, removed when a writer opens the store. Whole task groups (every
attempt of one task and seed) go into one flush, so a resumed collection skips exactly the
committed groups: nothing lost, nothing twice.

Opening checks every committed flush against its marker: readers check sizes, ArrayRecord's
status and record counts (cheap); the writer also hashes every byte, so a resumed collection
never builds on a damaged store. A damaged flush is a StoreError naming the file and what is
wrong, and the repair command (`python -m rmsweb_jax.collect.store --check/--repair DIR`, see
store_check.py), which moves damaged flushes to quarantine/ so their groups are collected again.
A record that fails its checksum when read is a StoreError naming its shard.

store.json also records the policy collecting into the store (a writer for another policy is
refused: one store, one policy, so reports and SFT know whose trajectories they read) and the
provenance of the steps (prompt settings, tokenizer and image-processor hashes, see
store_provenance.py), which a reader rebuilding prompts compares with its own, and the retry
mode its groups were collected under (collect.retry_mode; a collector of the other mode is
refused: one store, one meaning of "retried").

Shards are written with group_size 1, so Grain's ArrayRecordDataSource reads any record
directly (see sft_view.SFTView for the training view).

A store on a bucket (gs://...) is read and written through a local mirror (rmsweb_jax/storage.py):
array_record reads and writes local files only. Opening pulls the bucket folder into the mirror
(files the bucket lacks, e.g. shards a killed writer never uploaded, are dropped); a flush uploads
its steps shard, its trajectories shard and then its marker, so on the bucket too the marker commits
the flush. A bucket has no flock: one writer per store is the caller's duty (process 0 on a pod slice).
"""
from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import time
from typing import Any, Iterable, Iterator, Sequence

from array_record.python.array_record_module import ArrayRecordReader, ArrayRecordWriter

from rmsweb_jax.collect.records import SCHEMA_VERSION, StepRecord, TrajectoryRecord
from rmsweb_jax.collect.store_layout import (
    LAYOUT, RECORDINGS, STEPS, STORE_FILE, STORE_FORMAT, TMP_PREFIX, TRAJECTORIES, Flush, StoreError, close_failed, describe,
    find_damage, load_flushes, lock_store, marker_name, open_reader, orphan_files, parse_shard_name, pull_store,
    push_store, read_meta, repair_hint, shard_name, used_seqs, write_atomic)
from rmsweb_jax import storage
from rmsweb_jax.durable import file_sha256, fsync_dir, fsync_file

# group_size 1: every record is its own chunk, as random access (Grain) wants. zstd is cheap on
# CPU and the PNG bytes inside do not compress further anyway.
WRITER_OPTIONS = "group_size:1,zstd:3"
VERIFY = ("quick", "full")

Attempt = tuple[TrajectoryRecord, Sequence[StepRecord]]

# collect.retry_mode (see retries.py). A store that records none was collected before the setting
# existed, when every retry was reflection-conditioned.
REFLECTION, PLAIN = "reflection", "plain"
RETRY_MODES = (REFLECTION, PLAIN)
RETRY_MODE_MEANINGS = {REFLECTION: "retries conditioned on reflections", PLAIN: "retries without reflections"}


class TrajectoryStore:
    """Reads a store folder: committed trajectories, the steps of each, counts.

        store = TrajectoryStore("workdir/store")
        for traj in store.trajectories():
            steps = store.steps(traj)

    Only the flushes committed when it was opened are visible; a writer working in the same
    folder is not disturbed. `verify` "quick" checks sizes, reader status and record counts of
    every shard on open, "full" also their sha256 (reads every byte). Raises StoreError naming
    the damaged files.
    """

    def __init__(self, directory: str | os.PathLike, *, verify: str = "quick"):
        if verify not in VERIFY:
            raise ValueError(f"verify must be one of {VERIFY}, got {verify!r}")
        # A gs:// store is read from its local mirror; `location` names the store as the user gave it.
        self.location = str(directory)
        self.remote = self.location if storage.is_remote(directory) else None
        self.directory = pull_store(directory)
        self.meta = read_meta(self.directory)
        self._flushes, damage = load_flushes(self.directory, self.meta)
        damage += find_damage(self.directory, self._flushes, full=verify == "full")
        if damage:
            raise StoreError(describe(self.directory, sorted(damage, key=lambda d: d.flush.seq)))
        self._readers: dict[str, ArrayRecordReader] = {}

    @property
    def policy(self) -> str | None:
        """Returns the name of the policy whose trajectories the store holds (None: not recorded)."""
        return self.meta.get("policy")

    @property
    def provenance(self) -> dict[str, Any] | None:
        """Returns what the steps were produced with (store_provenance.provenance), None if not recorded."""
        return self.meta.get("provenance")

    @property
    def retry_mode(self) -> str | None:
        """Returns the retry mode the store's groups were collected under (RETRY_MODES; None: not recorded)."""
        return self.meta.get("retry_mode")

    def check_provenance(self, expected: dict[str, Any]) -> list[str]:
        """Returns the provenance keys where `expected` (how a reader rebuilds the prompts) differs
        from what the steps were produced with, logging a warning naming them; [] when they agree
        or the store recorded nothing to compare."""
        from rmsweb_jax.collect.store_provenance import warn_if_differs
        return warn_if_differs(self.directory, self.provenance, expected)

    # --- shards -------------------------------------------------------------------------
    def committed_flushes(self) -> list[int]:
        """Returns the sequence numbers of the committed flushes."""
        return sorted(self._flushes)

    def trajectory_shards(self) -> list[pathlib.Path]:
        """Returns the committed trajectories shards, oldest first."""
        return [self.directory / self._flushes[s].trajectories["file"] for s in self.committed_flushes()]

    def step_shards(self) -> list[pathlib.Path]:
        """Returns the committed steps shards, oldest first (a flush of only step-less attempts
        has none)."""
        return [self.directory / self._flushes[s].steps["file"] for s in self.committed_flushes()
                if self._flushes[s].steps]

    # --- records ------------------------------------------------------------------------
    def trajectories(self) -> Iterator[TrajectoryRecord]:
        """Yields every committed TrajectoryRecord, in commit order."""
        for path in self.trajectory_shards():
            for data in self._read(path, None):
                yield TrajectoryRecord.from_bytes(data)

    def steps(self, trajectory: TrajectoryRecord) -> list[StepRecord]:
        """Returns the StepRecords of `trajectory`, in step order."""
        if trajectory.num_steps == 0:
            return []
        path = self.directory / trajectory.steps_shard
        flush = self._flushes.get((parse_shard_name(trajectory.steps_shard) or ("", 0))[1])
        if flush is None or not flush.steps or flush.steps["file"] != trajectory.steps_shard:
            raise StoreError(f"steps shard {path} of {trajectory.request_id} is not a committed shard of the store")
        positions = list(range(trajectory.steps_start, trajectory.steps_start + trajectory.num_steps))
        steps = [StepRecord.from_bytes(d) for d in self._read(path, positions)]
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
        """Returns the (task id, seed) of every committed task group (from the commit markers)."""
        return {key for flush in self._flushes.values() for key in flush.task_groups}

    def counts(self) -> dict[str, int]:
        """Returns {"tasks", "trajectories", "successful_trajectories", "steps", "flushes"}."""
        trajs = list(self.trajectories())
        return {"tasks": len({t.key for t in trajs}), "trajectories": len(trajs),
                "successful_trajectories": sum(t.success for t in trajs), "steps": sum(t.num_steps for t in trajs),
                "flushes": len(self._flushes)}

    def _read(self, path: pathlib.Path, positions: list[int] | None) -> list[bytes]:
        key = str(path)
        if key not in self._readers:
            self._readers[key] = open_reader(path)
        reader = self._readers[key]
        try:
            return reader.read_all() if positions is None else reader.read(positions)
        except RuntimeError as e:
            close_failed(self._readers.pop(key))
            raise StoreError(f"{path} is corrupt: {e}\n{repair_hint(self.directory)}") from None

    def close(self) -> None:
        """Closes the open shard readers (the store stays usable; readers reopen on demand)."""
        readers, self._readers = self._readers, {}
        errors = []
        for key, reader in readers.items():
            try:
                reader.close()
            except RuntimeError as e:
                errors.append(f"{key}: {e}")
        if errors:
            raise StoreError(f"closing the shard readers of {self.directory} failed: {'; '.join(errors)}")

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class StoreWriter(TrajectoryStore):
    """Appends task groups to a store folder (creating it), committing several groups per flush.

        with StoreWriter("workdir/store", flush_every_tasks=8, flush_every_s=30.0, policy=policy.name) as store:
            todo = [k for k in keys if k not in store.finished_task_keys()]
            store.add_group([(trajectory, steps), ...])   # every attempt of one task and seed

    Opening removes what a crashed writer left half-done and verifies every committed byte.
    `policy` (the collecting policy's name) is recorded when the store is created; opening a
    store of another policy raises StoreError. `provenance` (store_provenance.provenance) is
    recorded at creation and compared (a warning) on later opens. Groups wait in memory until
    `flush_every_tasks` groups are buffered or the oldest has waited `flush_every_s` (no defaults here:
    config.collect.flush_every_tasks / flush_every_s hold them); close() (also on an exception) commits
    what is buffered. One writer per folder (an flock).
    """

    def __init__(self, directory: str | os.PathLike, *, flush_every_tasks: int, flush_every_s: float,
                 policy: str | None = None, provenance: dict[str, Any] | None = None):
        if flush_every_tasks < 1:
            raise ValueError(f"flush_every_tasks must be >= 1, got {flush_every_tasks!r}")
        if flush_every_s < 0:
            raise ValueError(f"flush_every_s must be >= 0, got {flush_every_s!r}")
        directory, remote = storage.local_side(directory)
        remote = None if remote is None else str(remote)  # `location` stays the text the user gave
        directory.mkdir(parents=True, exist_ok=True)
        self._lock = lock_store(directory)  # on a bucket: one writer per mirror; one per store is the caller's duty
        try:
            if remote:
                pull_store(remote)
            if not (directory / STORE_FILE).exists():
                _write_json(directory / STORE_FILE, {
                    "format": STORE_FORMAT, "schema_version": SCHEMA_VERSION, "layout": LAYOUT,
                    "created": time.time(), "policy": policy, "provenance": provenance})
            check_policy(directory, read_meta(directory), policy)
            self.removed_orphans = _remove_orphans(directory)
            super().__init__(directory, verify="full")  # the local folder (a bucket's mirror, pulled above)
            self._adopt(policy, provenance)
            self.remote, self.location = remote, remote or self.location
            if remote:  # the bucket loses the orphans removed here and gains store.json's updates
                push_store(directory, remote)
        except BaseException:
            self._lock.close()
            raise
        self.flush_every_tasks = flush_every_tasks
        self.flush_every_s = flush_every_s
        self._committed = TrajectoryStore.finished_task_keys(self)
        self._buffer: list[list[Attempt]] = []
        self._buffered_since: float | None = None
        self._next_seq = max([*self._flushes, *used_seqs(directory)], default=0) + 1

    def _adopt(self, policy: str | None, provenance: dict[str, Any] | None) -> None:
        # A first-layout store gets its markers now (its files just passed a full read); a store
        # without a recorded policy or provenance takes this writer's.
        meta = dict(self.meta)
        if meta.get("layout") != LAYOUT:
            for flush in self._flushes.values():
                shards = [_shard_info(self.directory / s["file"]) for s in (flush.trajectories, flush.steps) if s]
                flush = dataclasses.replace(flush, trajectories=shards[0], steps=shards[1] if flush.steps else None,
                                            marker=True)
                _write_json(self.directory / marker_name(flush.seq), flush.to_json())
                self._flushes[flush.seq] = flush
            meta["layout"] = LAYOUT
        if meta.get("policy") is None and policy is not None:
            meta["policy"] = policy
        if meta.get("provenance") is None and provenance is not None:
            meta["provenance"] = provenance
        elif provenance is not None:
            self.check_provenance(provenance)
        if meta != self.meta:
            _write_json(self.directory / STORE_FILE, meta)
            self.meta = meta

    def claim_retry_mode(self, mode: str) -> None:
        """Records `mode` as the store's retry mode (store.json) unless it is recorded already;
        raises StoreError when the store's groups were collected under another (check_retry_mode)."""
        check_retry_mode(self.directory, self.meta, mode, has_groups=bool(self.finished_task_keys()))
        if self.meta.get("retry_mode") != mode:
            meta = {**self.meta, "retry_mode": mode}
            _write_json(self.directory / STORE_FILE, meta)
            self.meta = meta
            if self.remote:
                storage.push_files(self.directory, self.remote, [STORE_FILE])

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
        """Commits every buffered group as one flush: steps shard, trajectories shard, then the marker."""
        if not self._buffer:
            return
        seq = self._next_seq
        steps_name = shard_name(STEPS, seq)
        trajectories, steps = [], []
        for group in self._buffer:
            for traj, traj_steps in group:
                trajectories.append(_located(traj, steps_name if traj_steps else "", len(steps)))
                steps.extend(traj_steps)
        steps_info = _write_shard(self.directory / steps_name, (s.to_bytes() for s in steps)) if steps else None
        traj_info = _write_shard(self.directory / shard_name(TRAJECTORIES, seq), (t.to_bytes() for t in trajectories))
        recordings = tuple({"file": f"{RECORDINGS}/{t.recording['har']}", "bytes": t.recording["bytes"],
                            "sha256": t.recording["sha256"]} for t in trajectories if t.recording)
        flush = Flush(seq, traj_info, steps_info, tuple(group[0][0].key for group in self._buffer),
                      recordings=recordings)
        _write_json(self.directory / marker_name(seq), flush.to_json())  # the commit
        if self.remote:  # the marker last: on the bucket too it commits the flush
            storage.push_files(self.directory, self.remote, [*([steps_name] if steps else []),
                                                             traj_info["file"], marker_name(seq)])
        self._flushes[seq] = flush
        self._committed |= set(flush.task_groups)
        self._buffer, self._buffered_since = [], None
        self._next_seq = seq + 1

    def close(self) -> None:
        """Commits what is buffered, closes readers and releases the writer lock (idempotent)."""
        try:
            if not self._lock.closed:
                self.flush()
        finally:
            try:
                super().close()
            finally:
                if not self._lock.closed:
                    self._lock.close()


def check_policy(directory: pathlib.Path, meta: dict[str, Any], policy: str | None) -> None:
    """Raises StoreError when the store at `directory` (store.json `meta`) holds another policy's trajectories."""
    recorded = meta.get("policy")
    if policy is not None and recorded is not None and policy != recorded:
        raise StoreError(f"the trajectory store at {directory} holds the trajectories of policy {recorded!r}; this "
                         f"run's policy is {policy!r}: one store holds one policy's trajectories (reports and SFT "
                         f"read them as one). Collect into another store (collect.store_dir), or with {recorded!r}")


def check_retry_mode(directory: pathlib.Path, meta: dict[str, Any], mode: str, *, has_groups: bool) -> None:
    """Raises StoreError when the store at `directory` (store.json `meta`; `has_groups`: it holds
    task groups) was collected under another retry mode than `mode`, or `mode` is not one."""
    if mode not in RETRY_MODES:
        raise ValueError(f"retry mode {mode!r}: expected one of {list(RETRY_MODES)}")
    recorded = meta.get("retry_mode")
    how = "store.json records it"
    if recorded is None and has_groups:
        recorded, how = REFLECTION, "store.json records no mode: it was collected before collect.retry_mode existed"
    if recorded is not None and recorded != mode:
        raise StoreError(f"the trajectory store at {directory} was collected with collect.retry_mode={recorded!r} "
                         f"({RETRY_MODE_MEANINGS[recorded]}; {how}); this run's collect.retry_mode is {mode!r} "
                         f"({RETRY_MODE_MEANINGS[mode]}): one store holds one retry mode (its success@<=K and its "
                         f"retried trajectories mean one thing). Collect into another store (collect.store_dir), "
                         f"or set collect.retry_mode={recorded!r} to continue this one")


def _remove_orphans(directory: pathlib.Path) -> list[str]:
    removed = orphan_files(directory, read_meta(directory))
    for entry in removed:
        (directory / entry).unlink()
    if removed:
        fsync_dir(directory)
    return removed


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


def _write_shard(path: pathlib.Path, records: Iterable[bytes]) -> dict[str, Any]:
    """Writes the shard through a synced temp file and a rename; returns its marker entry."""
    tmp = path.with_name(TMP_PREFIX + path.name)
    writer = ArrayRecordWriter(str(tmp), WRITER_OPTIONS)
    count = 0
    try:
        for data in records:
            writer.write(data)
            count += 1
        if not writer.ok():
            raise OSError(f"writing shard {tmp} failed")
    finally:
        writer.close()
    fsync_file(tmp)
    info = {"file": path.name, "records": count, "bytes": tmp.stat().st_size, "sha256": file_sha256(tmp)}
    os.replace(tmp, path)
    return info


def _shard_info(path: pathlib.Path) -> dict[str, Any]:
    reader = open_reader(path)
    try:
        records = reader.num_records()
    finally:
        reader.close()
    return {"file": path.name, "records": records, "bytes": path.stat().st_size, "sha256": file_sha256(path)}


def _write_json(path: pathlib.Path, data: dict[str, Any]) -> None:
    write_atomic(path, json.dumps(data, indent=1).encode())


if __name__ == "__main__":  # python -m rmsweb_jax.collect.store --check/--repair DIR
    from rmsweb_jax.collect.store_check import main
    raise SystemExit(main())
