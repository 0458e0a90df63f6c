"""SFTView: the store's successful steps as a random-access source for Grain, reflection-free.

    source = SFTView("workdir/store")
    ds = grain.MapDataset.source(source).seed(0).shuffle().map(to_tokens)   # to_tokens(SFTExample)

Each item is an SFTExample: one step of a successful attempt with the earlier steps of that
attempt as history and the policy's turn as target. `attempts` picks the successful attempts:
"all" of them, or "first": only those solved on attempt 1, the data a collector without retries
would have kept (config.data.attempts; its task groups are then the groups solved on attempt 1).
Reflections are never part of an example: the retry that solved the task had them in context,
the training example does not (RMSWeb's "training data stays reflection-free"). Steps whose turn did not parse are not targets (they
stay in later steps' history, as the policy saw them).

The view is picklable (it carries an ArrayRecordDataSource and two index arrays; shard readers
reopen lazily in each Grain worker). It sees the flushes committed when it was built.
"""
from __future__ import annotations

import dataclasses
import os
import pathlib

import numpy as np
from array_record.python.array_record_module import ArrayRecordReader
from grain.python import ArrayRecordDataSource

from rmsweb_jax import storage
from rmsweb_jax.agents.policy import PastStep, StepContext
from rmsweb_jax.collect.records import StepRecord
from rmsweb_jax.collect.store import StoreError, TrajectoryStore

# Which successful attempts are examples (config.data.attempts).
ATTEMPT_CHOICES = {"all": "every successful attempt", "first": "attempts solved on attempt 1"}


@dataclasses.dataclass(frozen=True)
class SFTExample:
    """One training example: a step of a successful attempt, self-contained.

    `history` are the earlier steps of the same attempt (oldest first), `step` the current
    StepRecord (screenshot, elements, URL, ...); the target is `step.text` (thought + tool
    call), split as `target_thought` / `target_action_text`.
    """

    task_id: str
    seed: int
    attempt: int
    request_id: str
    instruction: str
    history: tuple[PastStep, ...]
    step: StepRecord

    @property
    def target_text(self) -> str:
        """Returns the assistant turn to learn: thought + tool call, as the policy wrote it."""
        return self.step.text

    @property
    def target_thought(self) -> str:
        """Returns the thought of the target turn."""
        return self.step.thought

    @property
    def target_action_text(self) -> str:
        """Returns the tool call of the target turn."""
        return self.step.action_text

    def context(self) -> StepContext:
        """Returns the StepContext a prompt builder renders for this example: no reflections, as
        on a first attempt (attempt 1, no key)."""
        return StepContext(task_id=self.task_id, instruction=self.instruction, observation=self.step.observation(),
                           history=self.history, reflections=(), attempt=1, step=self.step.step)


class SFTView:
    """The steps of the successful trajectories of a store, as `len()` + `[i]` (SFTExample);
    with attempts="first" only those of attempt 1.

    Raises StoreError naming the folder when it holds no store, no trajectories, or no
    successful step (of attempt 1, for "first"); ValueError for another `attempts`.
    """

    def __init__(self, store_dir: str | os.PathLike, *, attempts: str = "all"):
        if attempts not in ATTEMPT_CHOICES:
            raise ValueError(f"SFTView attempts={attempts!r}: expected one of {list(ATTEMPT_CHOICES)} (config.data."
                             f"attempts: {', '.join(f'{k} = {v}' for k, v in ATTEMPT_CHOICES.items())})")
        self.store_dir = store_dir if storage.is_remote(store_dir) else pathlib.Path(store_dir)
        self.attempts = attempts
        store = TrajectoryStore(self.store_dir)
        try:
            shards = store.step_shards()
            offsets = {p.name: 0 for p in shards}
            total = 0
            for p in shards:
                offsets[p.name] = total
                total += _num_records(p)
            current, first, group_of = [], [], []
            groups: dict[tuple[str, int], int] = {}
            n_traj = n_success = n_later = 0
            for traj in store.trajectories():
                n_traj += 1
                if not traj.success or traj.num_steps == 0:
                    continue
                if attempts == "first" and traj.attempt != 1:
                    n_later += 1  # solved only on a retry: not what a collector without retries keeps
                    continue
                n_success += 1
                base = offsets[traj.steps_shard] + traj.steps_start
                bad = set()
                if traj.parse_errors:
                    bad = {s.step for s in store.steps(traj) if s.parse_error is not None}
                group = groups.setdefault(traj.key, len(groups))
                for i in range(traj.num_steps):
                    if i not in bad:
                        current.append(base + i)
                        first.append(base)
                        group_of.append(group)
        finally:
            store.close()
        if n_traj == 0:
            raise StoreError(f"the trajectory store at {self.store_dir} holds no trajectories")
        if not current:
            later = f" ({n_later} more solved on a retry, left out by attempts='first')" if n_later else ""
            raise StoreError(f"the trajectory store at {self.store_dir} holds {n_traj} trajectories, "
                             f"{n_success} successful{later}, but no successful step to train on")
        self._source = ArrayRecordDataSource([str(p) for p in shards])
        self._current = np.asarray(current, dtype=np.int64)
        self._first = np.asarray(first, dtype=np.int64)
        self.num_trajectories = n_success
        # Which task group (task id, seed) each example comes from, known without reading it: data
        # splits (held-out steps) go by task group, so no task is on both sides.
        self.task_keys: tuple[tuple[str, int], ...] = tuple(groups)
        self._group = np.asarray(group_of, dtype=np.int64)

    def task_key(self, index) -> tuple[str, int]:
        """Returns the (task id, seed) of example `index` without reading its records."""
        return self.task_keys[int(self._group[int(index)])]

    def group_index(self) -> np.ndarray:
        """Returns, per example, the index of its task group in `task_keys` (int64 [len])."""
        return self._group.copy()

    def __len__(self) -> int:
        return len(self._current)

    def __getitem__(self, index) -> SFTExample:
        index = int(index)
        if not -len(self) <= index < len(self):
            raise IndexError(f"SFTView index {index} out of range for {len(self)} examples")
        cur, first = int(self._current[index]), int(self._first[index])
        records = [StepRecord.from_bytes(d) for d in self._source.__getitems__(list(range(first, cur + 1)))]
        step = records[-1]
        return SFTExample(task_id=step.task_id, seed=step.seed, attempt=step.attempt, request_id=step.request_id,
                          instruction=step.instruction, history=tuple(r.past_step() for r in records[:-1]), step=step)

    def __repr__(self) -> str:
        which = "" if self.attempts == "all" else f", attempts={self.attempts!r}"
        return (f"SFTView({str(self.store_dir)!r}{which}: {len(self)} steps of {self.num_trajectories} successful "
                "trajectories)")


def _num_records(path: pathlib.Path) -> int:
    reader = ArrayRecordReader(str(path))
    try:
        return reader.num_records()
    finally:
        reader.close()
