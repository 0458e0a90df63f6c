"""Deterministic synthetic task groups and stores, written through the real StoreWriter (tests, benches).

Two shapes, both with real PNG screenshots and actions resolved to their semantic targets against
the stored elements, as a collection would store them:

- `retry_group` / `click_step`: a small page with a Submit button; a group fails attempts (each
  reflecting on the ones before) until the attempt it is solved at (store, report, adapter tests).
- `task_group` / `write_synthetic_store`: form pages shaped like the demo's store (SFT pipelines
  and stages).

For `write_synthetic_store`, each task group is a small form page drawn as a real PNG screenshot
(a text box and buttons whose boxes match the stored element list); its successful attempt types
a word into the box, clicks the button named in the instruction and answers, each step's action
resolved to its semantic target against the elements as a collection would. Some groups first
fail an attempt (clicking the wrong button), so the store holds failed attempts and reflections
that SFT must leave out.
Nothing here is a collection result: it is shaped like the demo's store so pipelines and stages
can be exercised without a browser.
"""
from __future__ import annotations

import io
import pathlib

from PIL import Image, ImageDraw

from rmsweb_jax.collect.records import StepRecord, TrajectoryRecord, request_id
from rmsweb_jax.collect.store import StoreWriter
from rmsweb_jax.judges.base import Verdict
from rmsweb_jax.web.action_text import format_action
from rmsweb_jax.web.actions import RELATIVE, Action
from rmsweb_jax.web.elements import BBox, Element
from rmsweb_jax.web.semantics import resolve_target

# --- retry groups: failures until the solving attempt ----------------------------------------
SMALL_VIEWPORT = (160, 120)
SUBMIT_PAGE = (Element(id=1, role="button", name="Submit", bbox=BBox(10, 60, 80, 30), focusable=True, z=2),
               Element(id=2, role="textbox", name="", bbox=BBox(10, 30, 120, 20), value="hi", focusable=True, z=2))


def label_screenshot(label: str) -> bytes:
    """Returns a small PNG (SMALL_VIEWPORT) with `label` drawn on it (each step's image differs)."""
    img = Image.new("RGB", SMALL_VIEWPORT, "white")
    draw = ImageDraw.Draw(img)
    draw.rectangle([10, 60, 90, 90], fill=(30, 140, 60))
    draw.text((14, 10), label, fill="black")
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def click_step(task_id: str, seed: int, attempt: int, i: int, *, parse_error: bool = False,
               label: str = "") -> StepRecord:
    """Returns step `i` of an attempt on SUBMIT_PAGE: a click on Submit (or an unparseable turn run as wait)."""
    rid = request_id(task_id, seed, attempt)
    if parse_error:
        thought, action_text, action = "I will click", "<tool_call>{oops", Action("wait", seconds=0.0)
        text = f"{thought} {action_text}"
    else:
        action = Action.click(312, 625)
        thought = f"step {i}: click Submit"
        text, action_text = format_action(action, thought), format_action(action)
    action = action.with_target(resolve_target(action, SUBMIT_PAGE, viewport=SMALL_VIEWPORT))
    return StepRecord(task_id=task_id, seed=seed, attempt=attempt, request_id=rid, step=i,
                      instruction=f"Solve {task_id}", screenshot=label_screenshot(label or f"{rid}/{i}"),
                      url=f"http://127.0.0.1/{task_id}.html", title=task_id,
                      viewport=SMALL_VIEWPORT, screenshot_size=SMALL_VIEWPORT, coordinates="relative",
                      elements=SUBMIT_PAGE, focused_id=2, last_error=None, text=text, thought=thought,
                      action_text=action_text, action=action, parse_error="invalid_json: oops" if parse_error else None,
                      exec_error=None, prompt_tokens=100 + i, completion_tokens=10 + i)


def retry_group(task_id: str, seed: int, *, solved_at: int | None, attempts: int = 3, steps: int = 2,
                parse_error_at: tuple[int, int] | None = None,
                policy: str = "teacher") -> list[tuple[TrajectoryRecord, list[StepRecord]]]:
    """Returns the attempts of one task group: failures (raw reward -1) until `solved_at` (reward
    1; None: `attempts` failures), each reflecting on the ones before, judged "programmatic". A
    failed attempt takes `steps + 1` steps, the solving one `steps`. `parse_error_at` = (attempt,
    step) of an unparseable turn; `policy` names the policy on every attempt."""
    last = solved_at if solved_at is not None else attempts
    out, reflections = [], ()
    for a in range(1, last + 1):
        success = a == solved_at
        n = steps + (1 if not success else 0)
        recs = [click_step(task_id, seed, a, i, parse_error=parse_error_at == (a, i)) for i in range(n)]
        verdict = Verdict(outcome="success" if success else "failure", reason="reward", score=1.0 if success else -1.0,
                          judge="programmatic")
        traj = TrajectoryRecord(
            task_id=task_id, seed=seed, attempt=a, request_id=request_id(task_id, seed, a),
            task={"suite": "test", "id": task_id}, instruction=f"Solve {task_id}", reflections=reflections,
            verdict=verdict, success=success, reward=1.0 if success else -1.0, suite_success=success, num_steps=n,
            status="complete", end_reason="done", done=True, truncated=False, final_url="http://127.0.0.1/x",
            final_screenshot=label_screenshot("final"), wall_s=0.5, finished_at=1.0e9 + a, policy=policy,
            judge="programmatic", prompt_tokens=sum(r.prompt_tokens for r in recs),
            completion_tokens=sum(r.completion_tokens for r in recs),
            parse_errors=sum(r.parse_error is not None for r in recs))
        out.append((traj, recs))
        reflections = (*reflections, f"reflection after attempt {a} of {task_id}")
    return out


# --- form pages shaped like the demo's store ---------------------------------------------------
WORDS = ("alpha", "bravo", "delta", "kilo", "lima", "oscar", "tango", "zulu")
BUTTONS = ("Submit", "Cancel", "Next", "Back")


def page_elements(viewport: tuple[int, int], variant: int) -> tuple[Element, ...]:
    """Returns the page's elements: a text box, then the buttons in a row (layout shifts with `variant`)."""
    w, h = viewport
    x0 = 10 + 7 * (variant % 5)
    box = Element(id=1, role="textbox", name="Word", bbox=BBox(x0, 0.25 * h, 0.5 * w, 24), focusable=True, z=2)
    buttons = tuple(Element(id=2 + i, role="button", name=name, bbox=BBox(x0 + i * 0.22 * w, 0.6 * h, 0.18 * w, 30),
                            focusable=True, z=2) for i, name in enumerate(BUTTONS))
    return (box, *buttons)


def screenshot(viewport: tuple[int, int], elements: tuple[Element, ...], caption: str, typed: str = "") -> bytes:
    """Returns a PNG of the page: caption, the elements drawn at their boxes, the typed text."""
    img = Image.new("RGB", viewport, (250, 250, 250))
    draw = ImageDraw.Draw(img)
    draw.text((8, 6), caption, fill=(20, 20, 20))
    for e in elements:
        b = e.bbox
        fill = (255, 255, 255) if e.role == "textbox" else (40, 110, 200)
        draw.rectangle([b.x, b.y, b.x + b.width, b.y + b.height], fill=fill, outline=(90, 90, 90))
        label = typed if e.role == "textbox" else e.name
        draw.text((b.x + 4, b.y + 6), label, fill=(0, 0, 0) if e.role == "textbox" else (255, 255, 255))
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def _click(element: Element, viewport: tuple[int, int]) -> Action:
    return Action.click(*RELATIVE.from_css(element.bbox.center, viewport))


def attempt_steps(task_id: str, seed: int, attempt: int, *, success: bool, viewport: tuple[int, int],
                  variant: int) -> list[StepRecord]:
    """Returns the steps of one attempt: type the word, click the named button (the wrong one when
    it fails), answer (successful attempts only)."""
    elements = page_elements(viewport, variant)
    word, target = WORDS[variant % len(WORDS)], BUTTONS[variant % len(BUTTONS)]
    instruction = f"Type {word} into the box, then press {target}."
    wrong = BUTTONS[(variant + 1) % len(BUTTONS)]
    button = next(e for e in elements if e.name == (target if success else wrong))
    plan = [(Action.type_text(word, coordinate=RELATIVE.from_css(elements[0].bbox.center, viewport)),
             f"The box is empty; I type {word} into it.", ""),
            (_click(button, viewport), f"Now I press the {button.name} button.", word)]
    if success:
        plan.append((Action.answer_with("done"), "The form is submitted; the task is complete.", word))
    rid = request_id(task_id, seed, attempt)
    steps = []
    for i, (action, thought, typed) in enumerate(plan):
        action = action.with_target(resolve_target(action, elements, viewport=viewport, focused_id=1))
        text = format_action(action, thought)
        steps.append(StepRecord(
            task_id=task_id, seed=seed, attempt=attempt, request_id=rid, step=i, instruction=instruction,
            screenshot=screenshot(viewport, elements, f"{instruction} ({rid} step {i})", typed),
            url=f"http://127.0.0.1/synthetic/{task_id}.html", title=task_id, viewport=viewport,
            screenshot_size=viewport, coordinates="relative", elements=elements, focused_id=1, last_error=None,
            text=text, thought=thought, action_text=format_action(action), action=action))
    return steps


def task_group(task_id: str, seed: int, *, fail_first: bool, viewport: tuple[int, int],
               variant: int) -> list[tuple[TrajectoryRecord, list[StepRecord]]]:
    """Returns every attempt of one task group: an optional failed attempt, then the successful one."""
    out, reflections = [], ()
    for attempt, success in enumerate([False, True] if fail_first else [True], start=1):
        steps = attempt_steps(task_id, seed, attempt, success=success, viewport=viewport, variant=variant)
        verdict = Verdict(outcome="success" if success else "failure", reason="reward", score=1.0 if success else -1.0,
                          judge="programmatic")
        out.append((TrajectoryRecord(
            task_id=task_id, seed=seed, attempt=attempt, request_id=request_id(task_id, seed, attempt),
            task={"suite": "synthetic", "id": task_id}, instruction=steps[0].instruction, reflections=reflections,
            verdict=verdict, success=success, reward=1.0 if success else 0.0, suite_success=success,
            num_steps=len(steps), status="complete", end_reason="done", done=True, truncated=False,
            final_url=steps[-1].url, policy="synthetic", judge="programmatic"), steps))
        reflections = (*reflections, f"Attempt {attempt} pressed the wrong button; press the one the task names.")
    return out


def write_synthetic_store(directory: str | pathlib.Path, *, tasks: int = 6, seeds: int = 2,
                          viewport: tuple[int, int] = (500, 240), fail_every: int = 3) -> pathlib.Path:
    """Writes tasks x seeds task groups (every `fail_every`-th fails once first) into a new store
    folder and returns it. Successful steps: 3 per group."""
    directory = pathlib.Path(directory)
    with StoreWriter(directory, flush_every_tasks=4, flush_every_s=3600) as store:
        k = 0
        for t in range(tasks):
            for s in range(seeds):
                store.add_group(task_group(f"synthetic.form-{t}", s, fail_first=fail_every > 0 and k % fail_every == 0,
                                           viewport=viewport, variant=t + 3 * s))
                k += 1
    return directory
