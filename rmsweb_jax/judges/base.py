"""What every judge is given and hands back: JudgeInput in, Verdict out.

Programmatic judges (MiniWoB++'s reward) and LLM judges (WebVoyager, Online-Mind2Web's
WebJudge, WebTailBench's rubric) share this interface, so the collector and the evaluator
never care which one decides.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Protocol

from rmsweb_jax.agents.policy import PastStep

SUCCESS, FAILURE, ERROR = "success", "failure", "error"
OUTCOMES = (SUCCESS, FAILURE, ERROR)


@dataclasses.dataclass(frozen=True)
class JudgeInput:
    """One finished attempt as a judge sees it.

    `steps` are the attempt's steps in order (screenshot each step was taken on, URL, thought,
    action text); `final_screenshot` is the page after the last action; `final_answer` is the
    text of a closing `answer` action, if any; `reward` / `suite_success` are what the suite
    itself reported (MiniWoB++'s page reward), None for live suites.
    """

    task: Any
    instruction: str
    steps: tuple[PastStep, ...]
    final_screenshot: bytes | None = None
    final_answer: str | None = None
    reward: float | None = None
    suite_success: bool | None = None


@dataclasses.dataclass(frozen=True)
class Verdict:
    """A judge's decision. `outcome` is "success", "failure" or "error" (the judge could not
    decide: unparseable output, endpoint down); an error is never counted as a success.
    `reason` explains it in words; `raw` keeps the judge model's text; `calls` counts the
    endpoint calls it took, `prompt_tokens` / `completion_tokens` the tokens their replies
    reported (0 for judges without a model, and in stores written before they were recorded)."""

    outcome: str
    reason: str = ""
    score: float | None = None
    raw: str = ""
    judge: str = ""
    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0

    def __post_init__(self):
        if self.outcome not in OUTCOMES:
            raise ValueError(f"Verdict.outcome must be one of {OUTCOMES}, got {self.outcome!r}")

    @property
    def success(self) -> bool:
        """Returns whether the attempt counts as solved."""
        return self.outcome == SUCCESS

    def to_dict(self) -> dict[str, Any]:
        """Returns a JSON-ready dict."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Verdict":
        """Returns the verdict stored by `to_dict`."""
        return cls(**{f.name: d[f.name] for f in dataclasses.fields(cls) if f.name in d})


class Judge(Protocol):
    """Decides whether one attempt solved its task."""

    name: str

    def judge(self, attempt: JudgeInput) -> Verdict: ...
