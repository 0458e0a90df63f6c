"""Episode records: what a pool is asked to run, what a policy sees, and what it hands back."""
from __future__ import annotations

import dataclasses
import json
from typing import Any, Mapping

from rmsweb_jax.web.actions import Action
from rmsweb_jax.web.observation import Observation

COMPLETE, FAILED = "complete", "failed"


@dataclasses.dataclass(frozen=True)
class EpisodeRequest:
    """Run `task` once with `seed`, for at most `max_steps` actions. `request_id` defaults to
    "<task id>#<seed>"; a pool hands back exactly one Episode per request."""

    task: Any
    seed: int = 0
    max_steps: int = 30
    request_id: str = ""

    def __post_init__(self):
        if self.max_steps < 1:
            raise ValueError(f"EpisodeRequest.max_steps must be >= 1, got {self.max_steps!r}")
        if not self.request_id:
            object.__setattr__(self, "request_id", f"{getattr(self.task, 'id', self.task)}#{self.seed}")

    def to_dict(self) -> dict[str, Any]:
        """Returns a JSON-ready dict (the task through its own to_dict when it has one)."""
        task = self.task.to_dict() if hasattr(self.task, "to_dict") else self.task
        return {"task": task, "seed": self.seed, "max_steps": self.max_steps, "request_id": self.request_id}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], task_type=None) -> "EpisodeRequest":
        """Returns the request stored by `to_dict`; `task_type.from_dict` rebuilds the task."""
        task = task_type.from_dict(d["task"]) if task_type is not None else d["task"]
        return cls(task=task, seed=d["seed"], max_steps=d["max_steps"], request_id=d["request_id"])


@dataclasses.dataclass(frozen=True)
class History:
    """What a policy is given to choose the next action: the request, the instruction, the
    observations so far (the last is current) and the actions taken. `attempt` counts from 1
    (a re-run after a browser fault starts a new attempt); `worker` is the pool slot."""

    request: EpisodeRequest
    instruction: str
    observations: tuple[Observation, ...]
    actions: tuple[Action, ...]
    attempt: int = 1
    worker: int = 0

    @property
    def observation(self) -> Observation:
        """Returns the current observation."""
        return self.observations[-1]


@dataclasses.dataclass(frozen=True)
class Episode:
    """One finished episode as a pool hands it back.

    status "complete": the episode ran from reset to its end (done, or truncated at max_steps
    or the time limit) in one attempt without a browser fault. status "failed": every attempt
    hit a fault; `observations` / `actions` are empty and `faults` says why. `actions[i]` was
    taken on `observations[i]` and carries its semantic target. `recording` (web/recording.py
    Recording.to_dict) is the episode's recorded traffic when it was recorded; `off_record` the first
    URL a replayed episode asked for that its recording did not hold (None: none, or not replayed).
    """

    request: EpisodeRequest
    status: str
    instruction: str = ""
    observations: tuple[Observation, ...] = ()
    actions: tuple[Action, ...] = ()
    reward: float | None = None
    success: bool | None = None
    reason: str | None = None
    done: bool = False
    truncated: bool = False
    attempts: int = 1
    faults: tuple[str, ...] = ()
    wall_s: float = 0.0
    recording: dict[str, Any] | None = None
    off_record: str | None = None

    @property
    def complete(self) -> bool:
        """Returns whether the episode ran to its end."""
        return self.status == COMPLETE

    def to_dict(self) -> dict[str, Any]:
        """Returns a JSON-ready dict."""
        return {
            "request": self.request.to_dict(), "status": self.status, "instruction": self.instruction,
            "observations": [o.to_dict() for o in self.observations], "actions": [a.to_dict() for a in self.actions],
            "reward": self.reward, "success": self.success, "reason": self.reason, "done": self.done,
            "truncated": self.truncated, "attempts": self.attempts, "faults": list(self.faults), "wall_s": self.wall_s,
            "recording": self.recording, "off_record": self.off_record,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], task_type=None) -> "Episode":
        """Returns the episode stored by `to_dict`."""
        return cls(
            request=EpisodeRequest.from_dict(d["request"], task_type), status=d["status"], instruction=d["instruction"],
            observations=tuple(Observation.from_dict(o) for o in d["observations"]),
            actions=tuple(Action.from_dict(a) for a in d["actions"]), reward=d["reward"], success=d["success"],
            reason=d["reason"], done=d["done"], truncated=d["truncated"], attempts=d["attempts"],
            faults=tuple(d["faults"]), wall_s=d["wall_s"],
            # absent from episodes serialized before record/replay existed
            recording=d.get("recording"), off_record=d.get("off_record"),
        )

    def to_json(self) -> str:
        """Returns `to_dict()` as JSON."""
        return json.dumps(self.to_dict(), ensure_ascii=False)
