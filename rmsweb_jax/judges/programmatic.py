"""The programmatic judge: MiniWoB++'s own page reward decides, under the configured success rule."""
from __future__ import annotations

import math
import sys

from rmsweb_jax.judges.base import ERROR, FAILURE, SUCCESS, JudgeInput, Verdict
from rmsweb_jax.suites.success_rule import SUCCESS_RULES, check_success_rule, counts_as_success


class ProgrammaticJudge:
    """Judges by the raw reward the suite reported (MiniWoB++: in [-1, 1]) under `success`, a rule
    of suites/success_rule.py: "solved" (reward >= 1 - 1e-6; a partial reward is a failure) or
    "positive_reward" (any reward > 0). The verdict's score is the raw reward. Without a reward,
    the suite's own success flag decides; with neither, the verdict is an error (nothing to judge
    by)."""

    def __init__(self, *, success: str, name: str = "programmatic"):
        self.success = check_success_rule(success, "ProgrammaticJudge success")
        self.name = name

    def judge(self, attempt: JudgeInput) -> Verdict:
        """Returns the verdict read off `attempt.reward` (or `attempt.suite_success`)."""
        reward = attempt.reward
        if reward is not None:
            if isinstance(reward, bool) or not isinstance(reward, (int, float)) or not _finite(reward):
                return Verdict(outcome=ERROR, judge=self.name,
                               reason=f"JudgeInput.reward must be a finite number, got {reward!r}")
            won = counts_as_success(reward, self.success)
            return Verdict(outcome=SUCCESS if won else FAILURE, score=float(reward), judge=self.name,
                           reason=f"raw reward {reward:g}: {'' if won else 'not '}{self.success} "
                                  f"({SUCCESS_RULES[self.success]})")
        if attempt.suite_success is not None:
            return Verdict(outcome=SUCCESS if attempt.suite_success else FAILURE, judge=self.name,
                           reason=f"suite reported success={attempt.suite_success} (no reward)")
        return Verdict(outcome=ERROR, judge=self.name,
                       reason="no suite reward: JudgeInput.reward and suite_success are both None; the programmatic "
                              "judge needs the suite's reward (MiniWoB++), use an LLM judge for live suites")


def _finite(x: int | float) -> bool:
    # math.isfinite(10**400) raises OverflowError: an int is finite here only within float range.
    return math.isfinite(x) if isinstance(x, float) else abs(x) <= sys.float_info.max
