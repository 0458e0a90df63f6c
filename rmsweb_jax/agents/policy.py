"""What every policy is given and hands back: StepContext in, PolicyOutput out, batched.

One interface for the in-process Flax model, any OpenAI-compatible endpoint and the scripted
MiniWoB++ teacher, so collection, mining, Salvage-DS and evaluation drive them the same way.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Protocol, Sequence

from rmsweb_jax.web.action_text import parse_action
from rmsweb_jax.web.actions import Action
from rmsweb_jax.web.observation import Observation


@dataclasses.dataclass(frozen=True)
class PastStep:
    """One earlier step of the current attempt as the prompt shows it: the screenshot it was
    taken on (PNG bytes), the URL, and the model's thought and tool-call text."""

    screenshot: bytes
    url: str
    thought: str
    action_text: str


@dataclasses.dataclass(frozen=True)
class StepContext:
    """Everything a policy may use to choose the next action of one episode.

    `history` holds the earlier steps of this attempt (oldest first); `reflections` the
    reflections written after earlier failed attempts of the same task (empty on attempt 1
    and always empty in training data). `key` identifies the episode and step for policies
    that keep per-episode state (the scripted teacher): "<request id>/<step>". `draw` numbers
    the draws of a policy's own randomness for this task and seed: 1 on attempt 1 and on every
    reflection-conditioned retry (the same run, changed only by what the reflections say), the
    attempt number on a plain retry (collect.retry_mode "plain": a fresh draw). The scripted
    teacher keys its injected mistakes on it; model policies sample afresh on every call whatever
    the draw (so at temperature 0 a plain retry repeats itself).
    """

    task_id: str
    instruction: str
    observation: Observation
    history: tuple[PastStep, ...] = ()
    reflections: tuple[str, ...] = ()
    attempt: int = 1
    step: int = 0
    key: str = ""
    draw: int = 1


@dataclasses.dataclass(frozen=True)
class PolicyOutput:
    """A policy's turn: the raw assistant text, its thought, and the action it parses to.

    `action` is None when the text is not a valid action; `error` then names why (a
    ParseError reason and message). Token counts and log-probs are filled by model policies.
    `label` is a scripted policy's mark on its own turn, stored with the step: the
    ScriptedTeacher's injected mistake kind ("detour", "wrong_element", "early_stop"); None for
    a planned move and for every model policy.
    """

    text: str
    thought: str = ""
    action: Action | None = None
    error: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    logprobs: tuple[float, ...] | None = None
    label: str | None = None

    @classmethod
    def from_text(cls, text: str, observation: Observation, **counts: Any) -> "PolicyOutput":
        """Returns the output for an assistant turn, parsed in `observation`'s coordinate space."""
        parsed = parse_action(text, observation.coordinate_space)
        if parsed.ok:
            return cls(text=text, thought=parsed.thought, action=parsed.action, **counts)
        return cls(text=text, thought=text.split("<tool_call>")[0].strip(), error=f"{parsed.reason}: {parsed.message}",
                   **counts)


@dataclasses.dataclass(frozen=True)
class ReflectionRequest:
    """What a reflector is given after a failed attempt: the task, the attempt's steps (thought,
    action text, URL per step), the judge's verdict and reason, and the earlier reflections."""

    task_id: str
    instruction: str
    attempt: int
    steps: tuple[PastStep, ...]
    verdict: str
    verdict_reason: str
    earlier_reflections: tuple[str, ...] = ()
    key: str = ""


class Policy(Protocol):
    """Chooses actions for a batch of episodes at once and writes reflections.

    `act` returns one PolicyOutput per context, in order. `reflect` returns the text of one
    reflection. `stats()` returns call and token counts ({"calls", "prompt_tokens",
    "completion_tokens", ...}) for reports. `close()` releases what the policy holds.
    """

    name: str

    def act(self, contexts: Sequence[StepContext]) -> list[PolicyOutput]: ...

    def reflect(self, request: ReflectionRequest) -> str: ...

    def stats(self) -> dict[str, int]: ...

    def close(self) -> None: ...
