"""Salvage-DS rewards of sampled turns against the reference action: SampleScore per sample.

Every sample is parsed with its finish reason (`action_text.parse_turn` in the observation's
coordinate space, the rule mining's replay uses too) and compared with `web.semantics.compare_actions`. A sample
records two things, kept apart so that gates and metrics can use correctness under any reward:

- `correct`: compare_actions(...).same, never a partial page reward, and False for a truncated
  sample (finish_reason "length": the turn never ended, so it is not the policy's action even
  when the cut text happens to parse);
- `reward`, by `RewardSettings.kind`:
  * polarized: +1 correct, -1 otherwise (unparseable and truncated included: they get the invalid
    reward, never a mask, so the policy learns to finish and format its turn);
  * graded: +1 correct; a near miss whose category has a configured value in (-1, 0) gets it
    (config.salvage.graded); every other difference -1. The sign stays correctness.
  * partial_credit: the GUI-R1-style ablation baseline, a weighted sum in [0, 1] of a format term
    (the turn parsed and ended), an action-type term, a point term (the sampled CSS point inside
    the reference element's box, or within POINT_TOLERANCE_PX of the reference point when no
    element is there; typing without a point: the focused field is the reference's field) and a text term (token F1 of typed text / answers; exact match of keys, URL,
    scroll direction). Terms an action type does not have (a point for `answer`, text for a click)
    are granted when the type matches, so a correct action of any type scores the full weight sum.
    Its rewards are never negative and a wrong click on the right type still earns most of it: the
    weak, misleading relative updates that the polarized reward fixes.

`category` is compare_actions' category, or "truncated" (SCORE_CATEGORIES).
"""
from __future__ import annotations

import dataclasses
import math
from collections import Counter
from typing import Mapping, Sequence

from rmsweb_jax.errors import UserError
from rmsweb_jax.web.action_text import ParsedAction, ParseError, parse_turn
from rmsweb_jax.web.actions import RELATIVE, Action
from rmsweb_jax.web.elements import same_element
from rmsweb_jax.web.normalize import normalize_answer, normalize_keys, normalize_text, normalize_url
from rmsweb_jax.web.semantics import CATEGORIES, POINT_TOLERANCE_PX, compare_actions, resolve_on

REWARDS = ("polarized", "graded", "partial_credit")
TRUNCATED = "truncated"
SCORE_CATEGORIES = (*CATEGORIES, TRUNCATED)
# Categories graded may soften: a real action that missed in one detail. Unparseable, truncated,
# wrong type and premature answers are never near misses.
NEAR_MISS_CATEGORIES = tuple(c for c in CATEGORIES if c not in ("same", "unparseable", "wrong_action_type",
                                                                 "premature_answer"))
PARTIAL_CREDIT_TERMS = ("format", "action_type", "point", "text")


@dataclasses.dataclass(frozen=True)
class SampleScore:
    """One sampled turn's score: `correct` (the same action as the reference), `reward`, `category`."""

    correct: bool
    reward: float
    category: str


@dataclasses.dataclass(frozen=True)
class RewardSettings:
    """config.salvage's reward: `kind` (REWARDS), `graded` {near-miss category: value in (-1, 0)},
    `partial_credit` {term: weight >= 0} over PARTIAL_CREDIT_TERMS."""

    kind: str
    graded: Mapping[str, float]
    partial_credit: Mapping[str, float]

    def __post_init__(self):
        if self.kind not in REWARDS:
            raise UserError(f"config.salvage.reward = {self.kind!r}; expected one of {list(REWARDS)}")
        graded = {str(k): float(v) for k, v in dict(self.graded).items()}
        for category, value in graded.items():
            if category not in NEAR_MISS_CATEGORIES:
                raise UserError(f"config.salvage.graded.{category}: not a near-miss category; expected one of "
                                f"{list(NEAR_MISS_CATEGORIES)}")
            if not -1.0 < value < 0.0:
                raise UserError(f"config.salvage.graded.{category} = {value}; a near miss's reward must lie in "
                                "(-1, 0): only the same action is positive")
        weights = {str(k): float(v) for k, v in dict(self.partial_credit).items()}
        if set(weights) != set(PARTIAL_CREDIT_TERMS):
            raise UserError(f"config.salvage.partial_credit has terms {sorted(weights)}; expected exactly "
                            f"{list(PARTIAL_CREDIT_TERMS)}")
        if any(w < 0 or not math.isfinite(w) for w in weights.values()) or sum(weights.values()) <= 0:
            raise UserError(f"config.salvage.partial_credit weights {weights} must be finite, >= 0, with a "
                            "positive sum")
        object.__setattr__(self, "graded", graded)
        object.__setattr__(self, "partial_credit", weights)

    @classmethod
    def from_config(cls, salvage) -> "RewardSettings":
        """Returns the reward settings of the config.salvage block."""
        return cls(kind=salvage.reward, graded=dict(salvage.graded), partial_credit=dict(salvage.partial_credit))


def score_samples(texts: Sequence[str], reference_action: Action, observation, reward: RewardSettings, *,
                  finish_reasons: Sequence[str] | None = None) -> list[SampleScore]:
    """Returns one SampleScore per sampled turn `texts[i]` (finish_reasons[i] "stop" or "length";
    None = all "stop"). `observation` (the state's stored Observation) resolves pointer actions;
    without it pointer references must carry their target (compare_actions raises otherwise)."""
    if finish_reasons is not None and len(finish_reasons) != len(texts):
        raise ValueError(f"{len(finish_reasons)} finish_reasons for {len(texts)} texts")
    reasons = finish_reasons if finish_reasons is not None else ["stop"] * len(texts)
    if observation is not None and reference_action.target is None:
        reference_action = resolve_on(reference_action, observation)  # once, not per sample
    return [score_sample(t, r, reference_action, observation, reward) for t, r in zip(texts, reasons)]


def score_sample(text: str, finish_reason: str, reference_action: Action, observation,
                 reward: RewardSettings) -> SampleScore:
    """Returns the SampleScore of one sampled turn (see score_samples)."""
    parsed = parse_turn(text, finish_reason, observation.coordinate_space if observation is not None else RELATIVE)
    if isinstance(parsed, ParseError) and parsed.reason == TRUNCATED:
        # partial_credit: the format term fails first (a cut turn is not well formed), so 0.
        return SampleScore(False, 0.0 if reward.kind == "partial_credit" else -1.0, TRUNCATED)
    comparison = compare_actions(parsed, reference_action, observation)
    if reward.kind == "partial_credit":
        value = partial_credit(parsed, reference_action, observation, reward.partial_credit)
    elif comparison.same:
        value = 1.0
    elif reward.kind == "graded":
        value = reward.graded.get(comparison.category, -1.0)
    else:
        value = -1.0
    return SampleScore(comparison.same, value, comparison.category)


def partial_credit(parsed, reference: Action, observation, weights: Mapping[str, float]) -> float:
    """Returns the GUI-R1-style weighted sum of format, action-type, point and text terms (each in
    [0, 1]) of a parse result against the reference, normalized by the weight sum (so in [0, 1])."""
    total = sum(weights.values())
    if not isinstance(parsed, ParsedAction):
        return 0.0
    sampled = parsed.action
    terms = {"format": 1.0, "action_type": 0.0, "point": 0.0, "text": 0.0}
    if sampled.name == reference.name:
        terms["action_type"] = 1.0
        terms["point"] = _point_term(sampled, reference, observation)
        terms["text"] = _text_term(sampled, reference)
    return sum(weights[k] * v for k, v in terms.items()) / total


def _point_term(sampled: Action, reference: Action, observation) -> float:
    if reference.coordinate is None and (reference.target is None or reference.target.point is None):
        return 1.0  # an action without a point (typing into the focused field, keys, answers)
    if observation is not None and reference.target is None:
        reference = resolve_on(reference, observation)
    if sampled.coordinate is None:
        if sampled.name == "type" and observation is not None:  # typing into the focused field
            field, wanted = resolve_on(sampled, observation).target.element, reference.target.element
            return float(field is not None and wanted is not None and same_element(field, wanted))
        return 0.0
    if observation is not None:
        point = observation.coordinate_space.to_css(sampled.coordinate, observation.viewport)
    elif sampled.target is not None and sampled.target.point is not None:
        point = sampled.target.point
    else:
        raise ValueError(f"partial_credit on {reference.name} needs an observation to place the sampled point")
    target = reference.target
    if target is not None and target.element is not None:
        return 1.0 if target.element.bbox.contains(*point) else 0.0
    if target is None or target.point is None:
        return 0.0
    return 1.0 if math.dist(point, target.point) <= POINT_TOLERANCE_PX else 0.0


def _text_term(sampled: Action, reference: Action) -> float:
    name = reference.name
    if name in ("type", "answer"):
        norm = normalize_text if name == "type" else normalize_answer
        return token_f1(norm(sampled.text or "").casefold(), norm(reference.text or "").casefold())
    if name == "key":
        return float(normalize_keys(sampled.keys) == normalize_keys(reference.keys))
    if name == "navigate":
        return float(normalize_url(sampled.url or "") == normalize_url(reference.url or ""))
    if name == "scroll":
        return float(sampled.direction == reference.direction)
    return 1.0  # clicks, hovers, go_back, wait: no text to get wrong


def token_f1(a: str, b: str) -> float:
    """Returns the F1 of the whitespace tokens of `a` against `b` (1.0 when both are empty)."""
    ta, tb = a.split(), b.split()
    if not ta and not tb:
        return 1.0
    overlap = sum((Counter(ta) & Counter(tb)).values())
    if overlap == 0:
        return 0.0
    precision, recall = overlap / len(ta), overlap / len(tb)
    return 2 * precision * recall / (precision + recall)
