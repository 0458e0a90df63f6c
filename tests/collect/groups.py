"""Builds task groups of StepRecords / TrajectoryRecords for store tests (real PNGs, elements,
actions resolved against the elements), without a browser."""
from __future__ import annotations

import io

from PIL import Image, ImageDraw

from rmsweb_jax.collect.records import StepRecord, TrajectoryRecord, request_id
from rmsweb_jax.judges.base import Verdict
from rmsweb_jax.web.action_text import format_action
from rmsweb_jax.web.actions import Action
from rmsweb_jax.web.elements import BBox, Element
from rmsweb_jax.web.semantics import resolve_target

VIEWPORT = (160, 120)


def screenshot(label: str) -> bytes:
    """Returns a small PNG with `label` drawn on it (each step's image differs)."""
    img = Image.new("RGB", VIEWPORT, "white")
    draw = ImageDraw.Draw(img)
    draw.rectangle([10, 60, 90, 90], fill=(30, 140, 60))
    draw.text((14, 10), label, fill="black")
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


ELEMENTS = (Element(id=1, role="button", name="Submit", bbox=BBox(10, 60, 80, 30), focusable=True, z=2),
            Element(id=2, role="textbox", name="", bbox=BBox(10, 30, 120, 20), value="hi", focusable=True, z=2))


def step(task_id: str, seed: int, attempt: int, i: int, *, parse_error: bool = False, label: str = "") -> StepRecord:
    """Returns step `i` of an attempt: a click on Submit (or an unparseable turn run as wait)."""
    rid = request_id(task_id, seed, attempt)
    if parse_error:
        thought, action_text, action = "I will click", "<tool_call>{oops", Action("wait", seconds=0.0)
        text = f"{thought} {action_text}"
    else:
        action = Action.click(312, 625)
        thought = f"step {i}: click Submit"
        text, action_text = format_action(action, thought), format_action(action)
    action = action.with_target(resolve_target(action, ELEMENTS, viewport=VIEWPORT))
    return StepRecord(task_id=task_id, seed=seed, attempt=attempt, request_id=rid, step=i,
                      instruction=f"Solve {task_id}", screenshot=screenshot(label or f"{rid}/{i}"),
                      url=f"http://127.0.0.1/{task_id}.html", title=task_id,
                      viewport=VIEWPORT, screenshot_size=VIEWPORT, coordinates="relative", elements=ELEMENTS,
                      focused_id=2, last_error=None, text=text, thought=thought, action_text=action_text, action=action,
                      parse_error="invalid_json: oops" if parse_error else None, exec_error=None,
                      prompt_tokens=100 + i, completion_tokens=10 + i)


def group(task_id: str, seed: int, *, solved_at: int | None, attempts: int = 3, steps: int = 2,
          parse_error_at: tuple[int, int] | None = None) -> list[tuple[TrajectoryRecord, list[StepRecord]]]:
    """Returns the attempts of one task group: failures until `solved_at` (None: `attempts`
    failures), each reflecting on the ones before. A failed attempt takes `steps + 1` steps, the
    solving one `steps`. `parse_error_at` = (attempt, step) of an unparseable turn."""
    last = solved_at if solved_at is not None else attempts
    out, reflections = [], ()
    for a in range(1, last + 1):
        success = a == solved_at
        n = steps + (1 if not success else 0)
        recs = [step(task_id, seed, a, i, parse_error=parse_error_at == (a, i)) for i in range(n)]
        verdict = Verdict(outcome="success" if success else "failure", reason="reward", score=1.0 if success else -1.0,
                          judge="programmatic")
        traj = TrajectoryRecord(
            task_id=task_id, seed=seed, attempt=a, request_id=request_id(task_id, seed, a),
            task={"suite": "test", "id": task_id}, instruction=f"Solve {task_id}", reflections=reflections,
            verdict=verdict, success=success, reward=1.0 if success else -1.0, suite_success=success, num_steps=n,
            status="complete", end_reason="done", done=True, truncated=False, final_url="http://127.0.0.1/x",
            final_screenshot=screenshot("final"), wall_s=0.5, finished_at=1.0e9 + a, policy="teacher",
            judge="programmatic", prompt_tokens=sum(r.prompt_tokens for r in recs),
            completion_tokens=sum(r.completion_tokens for r in recs),
            parse_errors=sum(r.parse_error is not None for r in recs))
        out.append((traj, recs))
        reflections = (*reflections, f"reflection after attempt {a} of {task_id}")
    return out
