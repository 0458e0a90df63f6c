"""The trajectory store's files on disk: names, store.json, flush markers, and finding damaged flushes.

Layout of a store folder (store.py reads and writes it, store_check.py checks and repairs it):

    store.json                       {"format", "schema_version", "layout", "created", "policy", "provenance"}
    steps-000001.arrayrecord         StepRecords of every attempt committed in flush 1
    trajectories-000001.arrayrecord  TrajectoryRecords of flush 1
    flush-000001.json                flush 1's commit marker: per shard its record count, bytes and
                                     sha256, and the task groups it holds
    quarantine/<time>/               damaged flushes moved aside by the repair command, with README.json
    .lock                            held (flock) by the one writer

A flush exists once its marker exists: the marker is written last, so a crash leaves the whole
flush or none of it. The marker's counts and sizes are checked whenever a store is opened, so a
truncated shard is an error naming it, never a shard read as fewer records. A store written
before markers existed ("layout" absent from store.json) counts every trajectories shard as
committed and is checked as far as its files allow; the next writer records markers for it.
"""
from __future__ import annotations

import dataclasses
import fcntl
import json
import os
import pathlib
import re
from typing import Any

from array_record.python.array_record_module import ArrayRecordReader

from rmsweb_jax import storage
from rmsweb_jax.collect.records import SCHEMA_VERSION, TrajectoryRecord
from rmsweb_jax.durable import file_sha256, fsync_dir
from rmsweb_jax.errors import UserError

STORE_FILE = "store.json"
STORE_FORMAT = "rmsweb trajectory store"
LAYOUT = 2  # 2: flush markers; absent: the first layout, where the trajectories shard was the marker
LOCK_FILE = ".lock"
STEPS, TRAJECTORIES, FLUSH = "steps", "trajectories", "flush"
SUFFIX, MARKER_SUFFIX = ".arrayrecord", ".json"
TMP_PREFIX = ".tmp-"
QUARANTINE = "quarantine"
RECORDINGS = "recordings"  # recorded episodes (collect.record "har", web/recording.py); their sha256 in the markers
_SHARD = re.compile(rf"^({STEPS}|{TRAJECTORIES})-(\d{{6}}){re.escape(SUFFIX)}$")
_MARKER = re.compile(rf"^{FLUSH}-(\d{{6}}){re.escape(MARKER_SUFFIX)}$")


def pull_store(store_dir) -> pathlib.Path:
    """Returns the local folder of the store at `store_dir`: itself, or a gs:// store's mirror made equal to the
    bucket (rmsweb_jax/storage.py pull_tree; the mirror's lock kept, store.json always fetched: it is rewritten
    in place)."""
    return storage.pull_tree(store_dir, keep=(LOCK_FILE,), rewritten=(STORE_FILE,))


def push_store(local: pathlib.Path, remote) -> None:
    """Makes the gs:// store `remote` equal to its mirror `local` (storage.push_tree; the lock stays local)."""
    storage.push_tree(local, remote, skip=(LOCK_FILE,), rewritten=(STORE_FILE,))


class StoreError(UserError, RuntimeError):
    """A store folder that cannot be used as asked (missing, damaged, another schema or policy, locked);
    a UserError: main.py prints it as one line."""


def shard_name(kind: str, seq: int) -> str:
    """Returns the file name of flush `seq`'s shard of `kind` ("steps" or "trajectories")."""
    return f"{kind}-{seq:06d}{SUFFIX}"


def marker_name(seq: int) -> str:
    """Returns the file name of flush `seq`'s commit marker."""
    return f"{FLUSH}-{seq:06d}{MARKER_SUFFIX}"


def repair_hint(directory: pathlib.Path) -> str:
    """Returns what to do about a damaged store: the repair command, and what it does."""
    return (f"run `python -m rmsweb_jax.collect.store --repair {directory}` to move the damaged flushes to "
            f"{directory / QUARANTINE}/ (their task groups are then collected again by the next collect run), "
            "or put back intact copies of the files")


@dataclasses.dataclass(frozen=True)
class Flush:
    """One committed flush: its shards as written ({"file", "records", "bytes", "sha256"}; steps None
    when no attempt had a step) and its task groups. Counts are None for a first-layout flush."""

    seq: int
    trajectories: dict[str, Any]
    steps: dict[str, Any] | None
    task_groups: tuple[tuple[str, int], ...]
    marker: bool = True
    recordings: tuple[dict[str, Any], ...] = ()  # {"file", "bytes", "sha256"} of each HAR its attempts recorded

    def files(self) -> list[str]:
        """Returns the flush's file names: shards, then the marker (the order a repair moves them)."""
        shards = [s["file"] for s in (self.steps, self.trajectories) if s]
        return shards + ([marker_name(self.seq)] if self.marker else [])

    def to_json(self) -> dict[str, Any]:
        out = {"seq": self.seq, TRAJECTORIES: self.trajectories, STEPS: self.steps,
               "task_groups": [list(k) for k in self.task_groups]}
        if self.recordings:  # the HARs' sha256, the store's manifest of its recordings (collect.record)
            out["recordings"] = list(self.recordings)
        return out


@dataclasses.dataclass(frozen=True)
class Damage:
    """A damaged flush: what is wrong with which of its files ("<path>: <problem>" lines)."""

    flush: Flush
    problems: tuple[str, ...]


def lock_store(directory: pathlib.Path):
    """Returns the store's lock file, held (flock) until closed; StoreError when another process holds it."""
    lock = open(directory / LOCK_FILE, "a")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()
        raise StoreError(f"another process is writing to the store at {directory} (it holds {LOCK_FILE})") from None
    return lock


def read_meta(directory: pathlib.Path) -> dict[str, Any]:
    """Returns store.json of `directory`; StoreError when it is missing, not JSON or of another schema."""
    path = directory / STORE_FILE
    if not path.is_file():
        raise StoreError(f"no trajectory store at {directory} (missing {STORE_FILE})")
    try:
        meta = json.loads(path.read_text())
    except ValueError as e:
        raise StoreError(f"{path} is not JSON: {e}") from None
    if meta.get("schema_version") != SCHEMA_VERSION:
        raise StoreError(f"store {directory} has schema version {meta.get('schema_version')!r}; "
                         f"this code reads version {SCHEMA_VERSION} (see collect/records.py): collect into a new "
                         "store (collect.store_dir) with this code")
    return meta


def shard_files(directory: pathlib.Path) -> dict[tuple[str, int], str]:
    """Returns {(kind, seq): file name} of the shards in `directory` (committed or not)."""
    found = {}
    for entry in os.listdir(directory):
        parsed = parse_shard_name(entry)
        if parsed:
            found[parsed] = entry
    return found


def used_seqs(directory: pathlib.Path) -> set[int]:
    """Returns the flush numbers of every shard in the store folder and its quarantine (numbers
    are never reused, so a shard name means one flush's data for the store's life)."""
    folders = [directory, *(p for p in (directory / QUARANTINE).glob("*") if p.is_dir())]
    return {seq for folder in folders for _, seq in shard_files(folder)}


def parse_shard_name(name: str) -> tuple[str, int] | None:
    """Returns (kind, seq) of a shard file name, None for any other name."""
    m = _SHARD.match(name)
    return (m.group(1), int(m.group(2))) if m else None


def _marked(directory: pathlib.Path, meta: dict[str, Any]) -> set[int]:
    # The flushes that have a commit marker (readable or not); in the first layout, the
    # trajectories shard was the marker.
    if meta.get("layout") != LAYOUT:
        return {seq for kind, seq in shard_files(directory) if kind == TRAJECTORIES}
    return {int(m.group(1)) for m in map(_MARKER.match, os.listdir(directory)) if m}


def orphan_files(directory: pathlib.Path, meta: dict[str, Any]) -> list[str]:
    """Returns what an interrupted flush left: temp files, and shards of the flush after the last
    marked one (a crash can only interrupt the last flush; an unmarked shard of an earlier flush
    is damage, see load_flushes)."""
    marked = _marked(directory, meta)
    last = max(marked, default=0)
    orphans = []
    for entry in sorted(os.listdir(directory)):
        parsed = parse_shard_name(entry)
        if entry.startswith(TMP_PREFIX) or (parsed and parsed[1] > last) or (
                parsed and meta.get("layout") != LAYOUT and parsed[1] not in marked):
            orphans.append(entry)
    return orphans


def load_flushes(directory: pathlib.Path, meta: dict[str, Any]) -> tuple[dict[int, Flush], list[Damage]]:
    """Returns ({seq: Flush} of the committed flushes, damage found reading their markers)."""
    if meta.get("layout") != LAYOUT:
        return _first_layout_flushes(directory)
    flushes, damage = {}, []
    marked = _marked(directory, meta)
    for seq in sorted(marked):
        path = directory / marker_name(seq)
        try:
            d = json.loads(path.read_text())
            flush = Flush(seq, d[TRAJECTORIES], d[STEPS], tuple((k[0], int(k[1])) for k in d["task_groups"]))
        except (ValueError, KeyError, TypeError, IndexError) as e:
            # Without its marker the flush's counts are unknown: the whole flush goes to quarantine.
            damage.append(Damage(_unmarked(directory, seq), (f"{path}: unreadable commit marker ({e})",)))
            continue
        flushes[seq] = flush
    last = max(marked, default=0)
    for seq in sorted({seq for _, seq in shard_files(directory) if seq < last} - marked):
        damage.append(Damage(_unmarked(directory, seq, marker=False),
                             (f"{directory / marker_name(seq)}: missing, though later flushes have theirs "
                              "(a flush's marker is written last and never removed)",)))
    return flushes, damage


def _unmarked(directory: pathlib.Path, seq: int, marker: bool = True) -> Flush:
    files = shard_files(directory)
    shard = {kind: {"file": files[(kind, seq)]} if (kind, seq) in files else None for kind in (STEPS, TRAJECTORIES)}
    return Flush(seq, shard[TRAJECTORIES] or {"file": shard_name(TRAJECTORIES, seq)}, shard[STEPS], (), marker=marker)


def _first_layout_flushes(directory: pathlib.Path) -> tuple[dict[int, Flush], list[Damage]]:
    files = shard_files(directory)
    flushes, damage = {}, []
    for (kind, seq), name in sorted(files.items(), key=lambda x: x[0][1]):
        if kind != TRAJECTORIES:
            continue
        steps_name = files.get((STEPS, seq))
        steps = {"file": steps_name, "records": None, "bytes": None, "sha256": None} if steps_name else None
        shard = {"file": name, "records": None, "bytes": None, "sha256": None}
        try:
            records = [TrajectoryRecord.from_bytes(d) for d in read_all(directory / name)]
        except (StoreError, ValueError) as e:
            damage.append(Damage(Flush(seq, shard, steps, (), marker=False), (str(e),)))
            continue
        flushes[seq] = Flush(seq, shard, steps, tuple(dict.fromkeys(t.key for t in records)), marker=False)
    return flushes, damage


def find_damage(directory: pathlib.Path, flushes: dict[int, Flush], *, full: bool) -> list[Damage]:
    """Returns the damaged flushes: a shard missing, of another size than written, that ArrayRecord
    cannot open, or holding another number of records; with `full`, also one whose bytes changed
    (sha256), which reads every byte."""
    damage = []
    for seq in sorted(flushes):
        flush = flushes[seq]
        problems = [p for shard in (flush.trajectories, flush.steps) if shard
                    for p in _shard_problems(directory / shard["file"], shard, full)]
        if problems:
            damage.append(Damage(flush, tuple(problems)))
    return damage


def _shard_problems(path: pathlib.Path, shard: dict[str, Any], full: bool) -> list[str]:
    if not path.is_file():
        return [f"{path}: missing"]
    size, written = path.stat().st_size, shard.get("bytes")
    if written is not None and size != written:
        what = "truncated" if size < written else "grown"
        return [f"{path}: {what}: {size} of {written} bytes"]
    try:
        reader = open_reader(path)
    except StoreError as e:
        return [str(e)]
    try:
        records = reader.num_records()
    finally:
        reader.close()
    if shard.get("records") is not None and records != shard["records"]:
        return [f"{path}: holds {records} records; {shard['records']} were written"]
    if full and shard.get("sha256") is not None and file_sha256(path) != shard["sha256"]:
        return [f"{path}: contents changed since written (sha256 differs; same size)"]
    if full and shard.get("sha256") is None:
        try:
            read_all(path)  # a first-layout shard has no hash: read every record (Riegeli checks each chunk)
        except StoreError as e:
            return [str(e)]
    return []


def open_reader(path: pathlib.Path) -> ArrayRecordReader:
    """Returns an ArrayRecordReader of `path` whose status is ok; StoreError naming the file otherwise."""
    try:
        reader = ArrayRecordReader(str(path))
    except RuntimeError as e:
        raise StoreError(f"{path} is corrupt: {e}") from None
    if not reader.ok():
        try:
            reader.close()
            why = "ArrayRecord cannot open it"
        except RuntimeError as e:  # a failed reader reports why only when closed (empty for a cut footer)
            why = str(e) or "ArrayRecord cannot open it (no footer: the file was cut short)"
        raise StoreError(f"{path} is corrupt: {why}")
    return reader


def read_all(path: pathlib.Path) -> list[bytes]:
    """Returns every record of the shard at `path`; StoreError naming the file when one fails its checksum."""
    reader = open_reader(path)
    try:
        records = reader.read_all()
    except RuntimeError as e:
        close_failed(reader)
        raise StoreError(f"{path} is corrupt: {e}") from None
    reader.close()
    return records


def close_failed(reader: ArrayRecordReader) -> None:
    """Closes a reader whose read just failed (its close raises that error again, already reported)."""
    try:
        reader.close()
    except RuntimeError:
        return


def describe(directory: pathlib.Path, damage: list[Damage]) -> str:
    """Returns the StoreError message for damaged flushes: each file and its problem, then the repair."""
    lines = []
    for d in damage:
        groups = ", ".join(f"{t}/{s}" for t, s in d.flush.task_groups[:6])
        more = f" +{len(d.flush.task_groups) - 6} more" if len(d.flush.task_groups) > 6 else ""
        held = f" (flush {d.flush.seq}, task groups {groups}{more})" if groups else f" (flush {d.flush.seq})"
        lines.extend(f"  {p}{held}" for p in d.problems)
    return (f"the trajectory store at {directory} has {len(damage)} damaged flush(es):\n" + "\n".join(lines)
            + f"\n{repair_hint(directory)}")


def write_atomic(path: pathlib.Path, data: bytes) -> None:
    """Writes `data` to `path` through a synced temp file and a rename (all or nothing)."""
    tmp = path.with_name(TMP_PREFIX + path.name)
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)
