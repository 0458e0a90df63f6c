"""The WebTailBench rubric judge: per-criterion points from the task's rubric → earned/max → outcome.

WebTailBench's official verifier (Microsoft's multimodal rubric verification agent, `MMRubricAgent`,
shipped with the Fara release) is a ten-step pipeline (rubric generation, screenshot relevance,
per-criterion evidence, reality check, rescoring, side-effect penalties, outcome verification...)
on two hosted models. This judge reproduces its scoring core, not its pipeline: its Step 0c
("action-only rubric scoring") in one call — the task's precomputed rubric as JSON with empty
"justification" / "earned_points" fields for the judge to fill, conditional criteria marked with
"is_condition_met" and left out of both totals when unmet, totals computed here (never taken from
the model), and success iff earned/max ≥ 0.8 (the verifier's `rubric_score_threshold`). The
prompt is our condensed restatement of that step's scoring principles (best effort under
uncontrollable blockers, penalties for controllable failures, no cascading or double penalties),
not the official text; the last k screenshots are attached as extra evidence (k=0 gives the
official text-only form).
"""
from __future__ import annotations

import dataclasses
import json
import math
import sys
from typing import Any

from rmsweb_jax.judges.base import FAILURE, SUCCESS, JudgeInput, Verdict
from rmsweb_jax.judges.llm import (Chat, ChatSession, JudgeFailure, action_history, error_verdict, image_part,
                                   json_object, numbered, preview, task_text, text_part, trajectory_screenshots)

RUBRIC_THRESHOLD = 0.8

PROMPT = """Instructions: Grade how well a web agent completed a Task, criterion by criterion, against the Rubric below.
The Action History lists every action the agent took while attempting the Task. The Agent Output is the final answer it gave, which may or may not agree with the Action History{and_screenshots}.

Task: {task}{start_url}

Rubric: >>>
{rubric}
<<<

Action History: >>>
{actions}
<<<

Agent Output: >>>
{answer}
<<<
{screenshot_note}
Every criterion's "justification" and "earned_points" are empty. Fill them in: write the justification first, then the points.

Scoring principles:
1. Best effort: award full credit when the agent made a reasonable attempt but was stopped by something outside its control and reported it: a CAPTCHA, a login wall without credentials, the site down or erroring, the item discontinued, out of stock or sold out, no result matching every stated constraint.
2. Penalize controllable failures: a wrong selection when the right one was available, filters or the named platform not used, giving up early, and claims that nothing in the Action History{or_screenshots} supports.
3. Hard constraints named in the task (qualifications, product attributes, dates, explicit filters) count as met only when the result actually satisfies them; searching for a constraint earns little on its own.
4. Where the task wording or the data allow more than one reasonable reading, any defensible choice earns full credit.
5. The right method with a wrong final result (a miscount, a misread value) earns partial credit, 40-80% of the criterion's points.
6. Dependencies: a criterion that could not be attempted because of an uncontrollable blocker earns full credit, and a platform-wide blocker found on one criterion applies to its sibling criteria on that platform; a controllable error that made later criteria impossible costs those criteria too; never penalize the same deviation twice: judge each later criterion on what the agent did with what it actually found.
7. Conditional criteria (those with a "condition" field): add "is_condition_met" (true or false) from what actually happened; of mutually exclusive alternatives exactly one is true. When it is false, set earned_points to 0: the criterion is left out of the totals.
8. Trust the Action History{and_screenshots} over the Agent Output.

"earned_points" is a number from 0 to the criterion's "max_points". Do not output totals; they are computed from your items.

Reply with the Rubric as one pure JSON object {{"items": [...]}}: the same criteria in the same order, each keeping its fields and with "justification" and "earned_points" filled (plus "is_condition_met" for conditional criteria). Output nothing but the JSON."""


@dataclasses.dataclass(frozen=True)
class CriterionScore:
    """One scored rubric criterion; `counted` is False for a conditional criterion whose
    condition was not met (left out of both totals)."""

    criterion: str
    max_points: float
    earned_points: float
    counted: bool
    justification: str = ""

    def to_dict(self) -> dict[str, Any]:
        """Returns a JSON-ready dict."""
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class RubricRecord:
    """A rubric judgement in full: the verdict (score = earned/max) and every criterion's points."""

    verdict: Verdict
    items: tuple[CriterionScore, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """Returns a JSON-ready dict."""
        return {"verdict": self.verdict.to_dict(), "items": [i.to_dict() for i in self.items]}


def rubric_json(rubric) -> str:
    """Returns the rubric as the judge is shown it: {"items": [...]} in the official field order,
    with empty "justification" / "earned_points"."""
    items = []
    for item in rubric:
        entry: dict[str, Any] = {"criterion": item.criterion}
        if item.condition:
            entry["condition"] = item.condition
        points = int(item.max_points) if float(item.max_points).is_integer() else item.max_points
        entry.update(description=item.description, max_points=points, justification="", earned_points="")
        items.append(entry)
    return json.dumps({"items": items}, indent=2, ensure_ascii=False)


def parse_rubric_scores(text: str, rubric) -> list[CriterionScore]:
    """Returns one CriterionScore per rubric item from the judge's JSON reply; raises JudgeFailure
    naming the criterion and field at fault (missing JSON, missing criterion, points not a number
    or outside 0..max_points, a conditional criterion without a boolean is_condition_met)."""
    try:
        reply = json_object(text)
    except ValueError as e:
        raise JudgeFailure(f'WebTailBench rubric: expected a JSON object {{"items": [...]}}: {e}', raw=text) from None
    items = reply.get("items")
    if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
        raise JudgeFailure(f"WebTailBench rubric: expected key 'items' holding a list of objects, got {preview(items)}",
                           raw=text)
    matched = _match_items(items, rubric, text)
    scores = []
    for item, got in zip(rubric, matched):
        where = f"WebTailBench rubric criterion {item.criterion!r}"
        earned = _points(got.get("earned_points"))
        if earned is None or not -1e-9 <= earned <= item.max_points + 1e-9:
            raise JudgeFailure(f"{where}: expected earned_points a number in 0..{item.max_points:g}, got "
                               f"{got.get('earned_points')!r}", raw=text)
        counted = True
        if item.condition:
            met = got.get("is_condition_met")
            if isinstance(met, str) and met.strip().lower() in ("true", "false"):
                met = met.strip().lower() == "true"
            if not isinstance(met, bool):
                raise JudgeFailure(f"{where} is conditional: expected is_condition_met true or false, got {met!r}",
                                   raw=text)
            counted = met
        justification = got.get("justification")
        scores.append(CriterionScore(item.criterion, float(item.max_points), earned, counted,
                                     justification if isinstance(justification, str) else ""))
    return scores


def _match_items(items: list[dict], rubric, text: str) -> list[dict]:
    # By criterion name when every criterion is named back; else by position when the counts agree.
    by_name = {_norm(i.get("criterion")): i for i in items if isinstance(i.get("criterion"), str)}
    if all(_norm(r.criterion) in by_name for r in rubric):
        return [by_name[_norm(r.criterion)] for r in rubric]
    if len(items) == len(rubric):
        return items
    missing = [r.criterion for r in rubric if _norm(r.criterion) not in by_name]
    raise JudgeFailure(f"WebTailBench rubric: expected {len(rubric)} scored criteria, got {len(items)}; missing "
                       f"{missing[:3]}", raw=text)


def _norm(value: Any) -> str:
    return " ".join(str(value).lower().split())


def _points(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            return None
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, int):  # JSON integers are unbounded: one past float range is no score
        return float(value) if abs(value) <= sys.float_info.max else None
    return None


class WebTailBenchJudge:
    """The rubric judge over any chat endpoint: success iff earned/max ≥ `threshold` (0.8);
    `max_screenshots` last screenshots go with the prompt (0: text only)."""

    def __init__(self, chat: Chat, *, threshold: float = RUBRIC_THRESHOLD, max_screenshots: int = 3,
                 name: str = "webtailbench"):
        if not callable(chat):
            raise TypeError(f"chat must be callable (messages -> text), got {type(chat).__name__}")
        if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not 0 < threshold <= 1:
            raise ValueError(f"threshold must be a number in (0, 1], got {threshold!r}")
        if isinstance(max_screenshots, bool) or not isinstance(max_screenshots, int) or max_screenshots < 0:
            raise ValueError(f"max_screenshots must be an int >= 0, got {max_screenshots!r}")
        self.chat, self.threshold, self.max_screenshots, self.name = chat, float(threshold), max_screenshots, name

    def build_messages(self, attempt: JudgeInput) -> list[dict]:
        """Returns the rubric-scoring messages for `attempt`; raises JudgeFailure when its task has
        no rubric."""
        rubric = _rubric(attempt)
        shots = trajectory_screenshots(attempt)[-self.max_screenshots:] if self.max_screenshots else []
        start_url = getattr(attempt.task, "start_url", "") or ""
        text = PROMPT.format(
            task=task_text(attempt), start_url=f"\nStarting URL: {start_url}" if start_url else "",
            rubric=rubric_json(rubric), actions=numbered(action_history(attempt, drop_answer=True)) or "(no actions)",
            answer=(attempt.final_answer or "").strip() or "(the agent gave no final answer)",
            and_screenshots=" and the screenshots" if shots else "",
            or_screenshots=" or the screenshots" if shots else "",
            screenshot_note=(f"\nThe last {len(shots)} screenshots of the trajectory follow this text, oldest first; "
                             "what they show outweighs what the agent claims.\n" if shots else ""))
        return [{"role": "user", "content": [text_part(text)] + [image_part(png) for png in shots]}]

    def evaluate(self, attempt: JudgeInput) -> RubricRecord:
        """Returns the full rubric judgement of `attempt`."""
        session = ChatSession(self.chat)
        try:
            messages = self.build_messages(attempt)
            text = session.ask(messages, "WebTailBench rubric")
            scores = parse_rubric_scores(text, _rubric(attempt))
            total_max = sum(s.max_points for s in scores if s.counted)
            earned = sum(s.earned_points for s in scores if s.counted)
            if total_max <= 0:
                raise JudgeFailure("WebTailBench rubric: no criterion counts (every counted criterion has max_points 0 "
                                   "or every condition is unmet); expected at least one applicable criterion", raw=text)
        except JudgeFailure as failure:
            return RubricRecord(error_verdict(self.name, failure, session))
        score = earned / total_max
        # The tolerance keeps a score of exactly the threshold (11.2/14 = 0.79999... in floats) a success.
        outcome = SUCCESS if score >= self.threshold - 1e-9 else FAILURE
        reason = (f"rubric {earned:g}/{total_max:g} = {score:.3f} {'>=' if outcome == SUCCESS else '<'} "
                  f"{self.threshold:g}; " + "; ".join(f"{s.criterion}: {s.earned_points:g}/{s.max_points:g}"
                                                     + ("" if s.counted else " (condition unmet)") for s in scores))
        verdict = session.verdict(outcome, reason=reason, score=score, raw=text, judge=self.name)
        return RubricRecord(verdict, tuple(scores))

    def judge(self, attempt: JudgeInput) -> Verdict:
        """Returns the rubric verdict on `attempt`."""
        return self.evaluate(attempt).verdict


def _rubric(attempt: JudgeInput):
    rubric = tuple(getattr(attempt.task, "rubric", ()) or ())
    if not rubric:
        raise JudgeFailure(f"task {getattr(attempt.task, 'id', '?')!r} has no rubric; the WebTailBench judge needs the "
                           "Stagehand form of the task file (precomputed_rubric.items)")
    return rubric
