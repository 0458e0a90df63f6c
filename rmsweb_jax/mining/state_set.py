"""The RL state set: one CriticalState per state, in an ArrayRecord file, versioned like the store's records.

    write_state_set("workdir/mine/states.arrayrecord", states)
    states = StateSet("workdir/mine/states.arrayrecord")
    for i, state in enumerate(states):
        example = states.example(i)      # collect.sft_view.SFTExample: the exact policy context

A state does not copy its context (screenshots, history): it names it — the trajectory store
(`store_dir`), the attempt (`request_id`) and the step — and `StateSet.example` rebuilds the
SFTExample from the store, exactly as `SFTView` builds it (the attempt's earlier steps as history,
unparsed turns included, no reflections). The target to learn is `reference_text` /
`reference_action`: for a replay state the stored step's own turn; for a rollout state the
reference trajectory's turn at the divergence step.

Each record is a msgpack map tagged with `schema` (STATE_SCHEMA_VERSION) and `kind`
"critical_state"; change the fields here and bump the version. Fields:

| field | type | meaning |
|---|---|---|
| state_id | str | unique in a set: "<source>:<request id>/<step>" (`state_id`) |
| task_id, seed, attempt, request_id, step | str, int, int, str, int | which stored step is the context |
| store_dir | str | the trajectory store holding it |
| reference_text | str | the reference turn (thought + tool call) |
| reference_action | Action | the reference action with its semantic target (stored as `Action.to_dict()`) |
| failure_mode | str | one of mining.taxonomy.TAXONOMY, or "routine" |
| critical | bool | failure_mode != "routine" |
| replay_accuracy | float or None | share of the K replay samples that were the reference action |
| reference_logprob | float or None | log p(reference tool call + end of turn given the context and thought) |
| source | str | "replay" or "rollout" |
| prefix_matched | bool or None | rollouts: whether the rollout's steps before this one matched the reference's (None for replay) |
| teacher_label | str or None | the scripted teacher's injected-mistake label on the reference step |

The file is written to a temp name, synced, renamed and its folder synced: a reader sees the whole
set or none of it. On a bucket (gs://) the file is written in its local mirror and uploaded as one object
(array_record reads and writes local files only), and read from the mirror after a pull
(rmsweb_jax/storage.py); a state's `store_dir` may be a gs:// store (TrajectoryStore mirrors it).
"""
from __future__ import annotations

import dataclasses
import math
import os
import pathlib
from typing import Any, Iterable, Iterator, Mapping

import msgpack
from array_record.python.array_record_module import ArrayRecordWriter

from rmsweb_jax import storage
from rmsweb_jax.collect.records import StepRecord, TrajectoryRecord
from rmsweb_jax.collect.sft_view import SFTExample
from rmsweb_jax.collect.store import TrajectoryStore
from rmsweb_jax.collect.store_layout import StoreError, open_reader
from rmsweb_jax.durable import fsync_dir, fsync_file
from rmsweb_jax.errors import UserError
from rmsweb_jax.mining.taxonomy import FAILURE_MODES, ROUTINE
from rmsweb_jax.web.actions import Action

STATE_SCHEMA_VERSION = 1
KIND = "critical_state"
SOURCES = ("replay", "rollout")
# As the trajectory store: one record per chunk, so any state is read directly.
WRITER_OPTIONS = "group_size:1,zstd:3"
_TMP_PREFIX = ".tmp-"


class StateSetError(UserError):
    """A state-set file that cannot be read as one: missing, another schema version or kind, a bad field."""


def state_id(source: str, request_id: str, step: int) -> str:
    """Returns the id of the state of `source` at step `step` of attempt `request_id`: "<source>:<request id>/<step>"."""
    return f"{source}:{request_id}/{int(step)}"


@dataclasses.dataclass(frozen=True)
class CriticalState:
    """One RL state: which stored step is its context, the reference turn, and what mining found there
    (see the module docstring for every field). Raises ValueError naming the field at fault."""

    state_id: str
    task_id: str
    seed: int
    attempt: int
    step: int
    request_id: str
    store_dir: str
    reference_text: str
    reference_action: Action
    failure_mode: str
    critical: bool
    replay_accuracy: float | None
    reference_logprob: float | None
    source: str
    prefix_matched: bool | None
    teacher_label: str | None

    def __post_init__(self):
        # The stored dict form is accepted too, so a caller holding `Action.to_dict()` need not convert.
        if isinstance(self.reference_action, Mapping):
            object.__setattr__(self, "reference_action", Action.from_dict(self.reference_action))
        object.__setattr__(self, "store_dir", str(self.store_dir))
        problems = []
        for name in ("state_id", "task_id", "request_id", "store_dir", "reference_text"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                problems.append(f"{name} must be a non-empty string, got {getattr(self, name)!r}")
        for name, low in (("seed", None), ("attempt", 1), ("step", 0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or (low is not None and value < low):
                problems.append(f"{name} must be an int{'' if low is None else f' >= {low}'}, got {value!r}")
        if not isinstance(self.reference_action, Action):
            problems.append(f"reference_action must be an Action, got {type(self.reference_action).__name__}")
        if self.failure_mode not in FAILURE_MODES:
            problems.append(f"failure_mode must be one of {FAILURE_MODES}, got {self.failure_mode!r}")
        if not isinstance(self.critical, bool) or self.critical != (self.failure_mode != ROUTINE):
            problems.append(f"critical={self.critical!r} contradicts failure_mode {self.failure_mode!r} "
                            f"(critical exactly when it is not {ROUTINE!r})")
        if self.replay_accuracy is not None and (isinstance(self.replay_accuracy, bool) or not isinstance(
                self.replay_accuracy, (int, float)) or not 0.0 <= self.replay_accuracy <= 1.0):
            problems.append(f"replay_accuracy must be None or a number in [0, 1], got {self.replay_accuracy!r}")
        if self.reference_logprob is not None and (isinstance(self.reference_logprob, bool) or not isinstance(
                self.reference_logprob, (int, float)) or not math.isfinite(self.reference_logprob)
                or self.reference_logprob > 1e-4):
            problems.append(f"reference_logprob must be None or a finite number <= 0, got {self.reference_logprob!r}")
        if self.source not in SOURCES:
            problems.append(f"source must be one of {SOURCES}, got {self.source!r}")
        elif self.source == "replay" and self.prefix_matched is not None:
            problems.append(f"prefix_matched is for rollout states; a replay state has None, got {self.prefix_matched!r}")
        elif self.source == "rollout" and not isinstance(self.prefix_matched, bool):
            problems.append(f"a rollout state needs prefix_matched True or False, got {self.prefix_matched!r}")
        if self.teacher_label is not None and (not isinstance(self.teacher_label, str) or not self.teacher_label):
            problems.append(f"teacher_label must be None or a non-empty string, got {self.teacher_label!r}")
        if problems:
            raise ValueError(f"CriticalState {self.state_id!r}: " + "; ".join(problems))

    @property
    def key(self) -> tuple[str, int]:
        """Returns the task group of the state: (task id, seed)."""
        return (self.task_id, self.seed)

    def to_dict(self) -> dict[str, Any]:
        """Returns a msgpack/JSON-ready dict (the action as `Action.to_dict()`), without the schema tag."""
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        d["reference_action"] = self.reference_action.to_dict()
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "CriticalState":
        """Returns the state of `to_dict`; ValueError naming missing or unknown fields."""
        names = [f.name for f in dataclasses.fields(cls)]
        missing, unknown = sorted(set(names) - set(d)), sorted(set(d) - set(names))
        if missing or unknown:
            raise ValueError(f"a CriticalState record needs exactly the fields {names}; missing {missing}, "
                             f"unknown {unknown}")
        return cls(**{k: d[k] for k in names})

    def to_bytes(self) -> bytes:
        """Returns the msgpack encoding, tagged with the schema version and kind."""
        return msgpack.packb({"schema": STATE_SCHEMA_VERSION, "kind": KIND, **self.to_dict()}, use_bin_type=True)

    @classmethod
    def from_bytes(cls, data: bytes) -> "CriticalState":
        """Returns the state of `to_bytes`; ValueError for another schema version or kind, or bad fields."""
        try:
            d = msgpack.unpackb(data, raw=False, strict_map_key=False)
        except Exception as e:  # noqa: BLE001 — msgpack raises several types for corrupt input
            raise ValueError(f"not a state record ({type(e).__name__}: {e})") from None
        if not isinstance(d, dict) or d.get("kind") != KIND:
            raise ValueError(f"not a state record: expected a map of kind {KIND!r}, got "
                             f"{d.get('kind') if isinstance(d, dict) else type(d).__name__!r}")
        schema = d.pop("schema", None)
        if schema != STATE_SCHEMA_VERSION:
            raise ValueError(f"state record has schema version {schema!r}; this code reads version "
                             f"{STATE_SCHEMA_VERSION}")
        d.pop("kind")
        return cls.from_dict(d)


def write_state_set(path: str | os.PathLike, states: Iterable[CriticalState]) -> pathlib.Path:
    """Writes `states` to the ArrayRecord file `path` (all or nothing: temp file, fsync, rename, folder
    fsync; on a bucket one object uploaded from the local mirror) and returns the path. Raises ValueError for two
    states with one state_id."""
    path, remote = storage.local_side(path)
    states = list(states)
    seen: dict[str, int] = {}
    for i, state in enumerate(states):
        if not isinstance(state, CriticalState):
            raise TypeError(f"state {i} is a {type(state).__name__}, not a CriticalState")
        if state.state_id in seen:
            raise ValueError(f"states {seen[state.state_id]} and {i} share state_id {state.state_id!r}")
        seen[state.state_id] = i
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(_TMP_PREFIX + path.name)
    writer = ArrayRecordWriter(str(tmp), WRITER_OPTIONS)
    try:
        for state in states:
            writer.write(state.to_bytes())
        if not writer.ok():
            raise OSError(f"writing the state set {tmp} failed")
    finally:
        writer.close()
    fsync_file(tmp)
    os.replace(tmp, path)
    fsync_dir(path.parent)
    if remote:
        storage.upload(path, remote)
        return remote
    return path


class StateSet:
    """A state-set file as `len()`, `[i]`, iteration (CriticalState), and `example(i)` (its SFTExample).

    The states are read when it opens (they are small: no screenshots); the stores their contexts
    live in are opened on the first `example` call that needs them. StateSetError names the file and
    record at fault; StoreError the store and attempt.
    """

    def __init__(self, path: str | os.PathLike):
        self.path = storage.as_path(path)  # as given (gs:// too); read from `local`, its mirror on a bucket
        local = storage.pull_file(self.path)
        if not local.is_file():
            raise StateSetError(f"no state set at {self.path} (the mine stage writes <workdir>/mine/states.arrayrecord)")
        try:
            reader = open_reader(local)
        except StoreError as e:
            raise StateSetError(str(e)) from None
        try:
            records = reader.read_all()
        finally:
            reader.close()
        states = []
        for i, data in enumerate(records):
            try:
                states.append(CriticalState.from_bytes(data))
            except ValueError as e:
                raise StateSetError(f"{self.path} record {i}: {e}") from None
        self._states = tuple(states)
        self._stores: dict[str, tuple[TrajectoryStore, dict[str, TrajectoryRecord]]] = {}

    def __len__(self) -> int:
        return len(self._states)

    def __getitem__(self, index) -> CriticalState:
        return self._states[int(index)]

    def __iter__(self) -> Iterator[CriticalState]:
        return iter(self._states)

    def example(self, index) -> SFTExample:
        """Returns the SFTExample of state `index` rebuilt from its store: the step's record, and the
        attempt's earlier steps as history (as collect.sft_view.SFTView builds it)."""
        state = self[index]
        where = f"{self.path} record {int(index)} ({state.state_id})"
        store, attempts = self._store(state.store_dir, where)
        traj = attempts.get(state.request_id)
        if traj is None:
            raise StoreError(f"{where}: the store at {state.store_dir} holds no attempt {state.request_id!r}")
        if not 0 <= state.step < traj.num_steps:
            raise StoreError(f"{where}: attempt {state.request_id} in {state.store_dir} has {traj.num_steps} steps; "
                             f"the state is step {state.step}")
        steps: list[StepRecord] = store.steps(traj)[:state.step + 1]
        step = steps[-1]
        return SFTExample(task_id=step.task_id, seed=step.seed, attempt=step.attempt, request_id=step.request_id,
                          instruction=step.instruction, history=tuple(s.past_step() for s in steps[:-1]), step=step)

    def _store(self, store_dir: str, where: str):
        if store_dir not in self._stores:
            try:
                store = TrajectoryStore(store_dir)
            except StoreError as e:
                raise StoreError(f"{where}: {e}") from None
            self._stores[store_dir] = (store, {t.request_id: t for t in store.trajectories()})
        return self._stores[store_dir]

    def close(self) -> None:
        """Closes the stores opened for `example` (the set stays readable; they reopen on demand)."""
        stores, self._stores = self._stores, {}
        for store, _ in stores.values():
            store.close()

    def __enter__(self) -> "StateSet":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        critical = sum(s.critical for s in self._states)
        return f"StateSet({str(self.path)!r}: {len(self)} states, {critical} critical)"
