"""Which suite rewards count as a success: the rule named by config.collect.success.

MiniWoB++ gives partial rewards on some pages (click-checkboxes: (#right - #wrong) / n, so one
wrong box of five still scores 0.6). Counting every positive reward as a success made attempts
with wrong clicks "solved", and their wrong clicks SFT targets. The rules:

- "solved": the raw reward reaches 1 (within SOLVED_TOLERANCE): every part of the task right.
- "positive_reward": any raw reward > 0 (the behaviour before the rule existed).

The reward is the page's raw reward (WOB_RAW_REWARD_GLOBAL: no time discount).
"""
from __future__ import annotations

from rmsweb_jax.errors import UserError

SOLVED, POSITIVE_REWARD = "solved", "positive_reward"
# Rewards are sums of +-1/n in float64; 1e-6 absorbs their rounding, far below any 1/n step.
SOLVED_TOLERANCE = 1e-6
SUCCESS_RULES = {SOLVED: f"raw reward >= 1 - {SOLVED_TOLERANCE:g}", POSITIVE_REWARD: "raw reward > 0"}


def check_success_rule(rule: str, where: str = "success rule") -> str:
    """Returns `rule` when it is a known rule; raises UserError (a config value: one line)
    naming `where` and the choices."""
    if rule not in SUCCESS_RULES:
        raise UserError(f"{where} {rule!r}: expected one of {sorted(SUCCESS_RULES)} "
                         f"({'; '.join(f'{k}: {v}' for k, v in SUCCESS_RULES.items())})")
    return rule


def is_solved(reward: float) -> bool:
    """Returns whether a raw reward means the task was solved (reward >= 1 - SOLVED_TOLERANCE)."""
    return reward >= 1.0 - SOLVED_TOLERANCE


def counts_as_success(reward: float, rule: str) -> bool:
    """Returns whether raw `reward` is a success under `rule` ("solved" or "positive_reward")."""
    check_success_rule(rule)
    return is_solved(reward) if rule == SOLVED else reward > 0
