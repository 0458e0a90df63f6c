"""The programmatic judge: MiniWoB++'s own page reward decides."""
from __future__ import annotations

import math

from rmsweb_jax.judges.base import ERROR, FAILURE, SUCCESS, JudgeInput, Verdict


class ProgrammaticJudge:
    """Judges by the reward the suite reported: success iff reward > 0 (MiniWoB++ gives a reward
    in [-1, 1], positive only when the task's check passed). Without a reward, the suite's own
    success flag decides; with neither, the verdict is an error (nothing to judge by)."""

    def __init__(self, name: str = "programmatic"):
        self.name = name

    def judge(self, attempt: JudgeInput) -> Verdict:
        """Returns the verdict read off `attempt.reward` (or `attempt.suite_success`)."""
        reward = attempt.reward
        if reward is not None:
            if isinstance(reward, bool) or not isinstance(reward, (int, float)) or not math.isfinite(reward):
                return Verdict(outcome=ERROR, judge=self.name,
                               reason=f"JudgeInput.reward must be a finite number, got {reward!r}")
            outcome = SUCCESS if reward > 0 else FAILURE
            return Verdict(outcome=outcome, score=float(reward), judge=self.name,
                           reason=f"suite reward {reward:g} {'>' if reward > 0 else '<='} 0")
        if attempt.suite_success is not None:
            return Verdict(outcome=SUCCESS if attempt.suite_success else FAILURE, judge=self.name,
                           reason=f"suite reported success={attempt.suite_success} (no reward)")
        return Verdict(outcome=ERROR, judge=self.name,
                       reason="no suite reward: JudgeInput.reward and suite_success are both None; the programmatic "
                              "judge needs the suite's reward (MiniWoB++), use an LLM judge for live suites")
