"""Divergence of failed rollouts from their reference trajectories, on real stores written from
known action sequences (no browser): the divergence step, detour skipping on both sides,
prefix_matched, and each way an episode can fail (taxonomy). The browser tests, with rollouts of
the ScriptedTeacher through the collector, are in test_rollouts_browser.py."""
import dataclasses

import pytest

from rmsweb_jax.collect.records import StepRecord, TrajectoryRecord, request_id
from rmsweb_jax.collect.store_fixture import page_elements, screenshot
from rmsweb_jax.judges.base import Verdict
from rmsweb_jax.mining.rollouts import align, divergences, find_divergences, policy_id, rollout_store_dir
from rmsweb_jax.mining.state_set import StateSet, write_state_set
from rmsweb_jax.web.action_text import format_action
from rmsweb_jax.web.actions import RELATIVE, Action
from rmsweb_jax.web.semantics import resolve_target
from tests.settings import store_writer

VIEWPORT = (500, 240)
ELEMENTS = page_elements(VIEWPORT, 0)  # Word textbox, then buttons Submit, Cancel, Next, Back
WINDOW = 3


def _at(name):
    element = next(e for e in ELEMENTS if e.name == name)
    return RELATIVE.from_css(element.bbox.center, VIEWPORT)


CLICK_NEXT = Action.click(*_at("Next"))
CLICK_SUBMIT = Action.click(*_at("Submit"))
CLICK_CANCEL = Action.click(*_at("Cancel"))
TYPE = Action.type_text("alpha", coordinate=_at("Word"))
WAIT = Action("wait", seconds=0.3)
HOVER = Action("hover", coordinate=_at("Back"))
ANSWER = Action.answer_with("done")
# The reference: a planned move, a labelled detour, then the rest of the plan.
REFERENCE = [(CLICK_NEXT, None), (WAIT, "detour"), (TYPE, None), (CLICK_SUBMIT, None), (ANSWER, None)]
GARBLED = "garbled"  # an unparseable turn (stored as the collector's `wait` stand-in)


def _steps(task_id, moves, *, attempt=1):
    rid = request_id(task_id, 0, attempt)
    out = []
    for i, (action, label) in enumerate(moves):
        parse_error = None
        if action == GARBLED:
            action, parse_error = Action("wait", seconds=0.0), "invalid_json: Expecting value"
            text, action_text = "I click <tool_call>{oops", "<tool_call>{oops"
        else:
            action = action.with_target(resolve_target(action, ELEMENTS, viewport=VIEWPORT, focused_id=1))
            text, action_text = format_action(action, f"step {i}"), format_action(action)
        out.append(StepRecord(
            task_id=task_id, seed=0, attempt=attempt, request_id=rid, step=i, instruction="Type alpha, press Submit.",
            screenshot=screenshot(VIEWPORT, ELEMENTS, f"{rid} step {i}"), url=f"http://127.0.0.1/{task_id}.html",
            title=task_id, viewport=VIEWPORT, screenshot_size=VIEWPORT, coordinates="relative", elements=ELEMENTS,
            focused_id=1, last_error=None, text=text, thought=f"step {i}", action_text=action_text, action=action,
            parse_error=parse_error, label=label))
    return out


def _attempt(task_id, moves, *, success, truncated=False, policy="teacher"):
    steps = _steps(task_id, moves)
    verdict = Verdict(outcome="success" if success else "failure", reason="reward", score=1.0 if success else -1.0,
                      judge="programmatic")
    traj = TrajectoryRecord(
        task_id=task_id, seed=0, attempt=1, request_id=request_id(task_id, 0, 1),
        task={"suite": "synthetic", "id": task_id, "start_url": f"{task_id}.html"}, instruction=steps[0].instruction,
        reflections=(), verdict=verdict, success=success, reward=1.0 if success else -1.0, suite_success=success,
        num_steps=len(steps), status="complete", end_reason="max_steps" if truncated else "done", done=not truncated,
        truncated=truncated, policy=policy, judge="programmatic")
    return [(traj, steps)]


# Rollout case -> (its moves without labels, success, truncated).
ROLLOUTS = {
    "wrong-element": ([CLICK_NEXT, TYPE, CLICK_CANCEL], False, False),
    "own-detour": ([CLICK_NEXT, HOVER, TYPE, CLICK_CANCEL], False, False),
    "loop": ([CLICK_NEXT, TYPE, TYPE, TYPE], False, True),
    "out-of-steps": ([CLICK_NEXT, TYPE], False, True),
    "wait-loop": ([CLICK_NEXT, WAIT, WAIT, WAIT], False, True),
    "early-answer": ([CLICK_NEXT, ANSWER], False, False),
    "garbled": ([CLICK_NEXT, GARBLED], False, False),
    "matched": ([CLICK_NEXT, TYPE, CLICK_SUBMIT, ANSWER], False, False),
    "solved": ([CLICK_NEXT, TYPE, CLICK_SUBMIT, ANSWER], True, False),
    "stranger": ([CLICK_CANCEL], False, False),  # a task with no reference in the store
}


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    root = tmp_path_factory.mktemp("rollouts")
    reference = root / "store"
    with store_writer(reference, policy="teacher") as store:
        for case in ROLLOUTS:
            if case != "stranger":
                store.add_group(_attempt(f"synthetic.{case}", REFERENCE, success=True))
        # A group the teacher never solved: no reference for anyone.
        store.add_group(_attempt("synthetic.unsolved", REFERENCE[:2], success=False))
    rollouts = rollout_store_dir(root, "flax:sft@0123456789")
    with store_writer(rollouts, policy="flax:sft@0123456789") as store:
        for case, (moves, success, truncated) in ROLLOUTS.items():
            store.add_group(_attempt(f"synthetic.{case}", [(m, None) for m in moves], success=success,
                                     truncated=truncated, policy="flax:sft@0123456789"))
    return reference, rollouts


def _by_task(report):
    return {d.state.task_id.removeprefix("synthetic."): d for d in report.divergences}


def test_rollout_store_is_named_after_the_checkpoint(tmp_path):
    assert rollout_store_dir(tmp_path, "flax:sft@0123456789") == tmp_path / "mine" / "rollouts" / "sft@0123456789"
    assert policy_id("http:http://127.0.0.1:8000/v1#qwen") == "http_http_127.0.0.1_8000_v1_qwen"
    with pytest.raises(ValueError, match="no usable folder name"):
        policy_id("flax:/")


def test_divergence_steps_modes_and_prefixes(stores):
    reference, rollouts = stores
    report = find_divergences(reference, rollouts, skip_labels=("detour",), repetition_window=WINDOW)
    assert report.counts == {"rollouts": 10, "solved": 1, "failed": 9, "diverged": 7, "matched_throughout": 1,
                             "no_reference": 1, "undecided": 0}
    found = _by_task(report)
    # case -> (reference step, failure mode, prefix_matched, rollout step, rollout steps skipped)
    expected = {
        "wrong-element": (3, "wrong_element", True, 2, ()),      # reference step 1 is a skipped detour
        "own-detour": (3, "wrong_element", False, 3, (1,)),      # the rollout's hover is passed over
        "loop": (3, "repetition_loop", True, 2, ()),              # typed where Submit is due, then kept typing
        "out-of-steps": (3, "out_of_steps", True, None, ()),
        "wait-loop": (2, "repetition_loop", False, None, (1, 2, 3)),
        "early-answer": (2, "premature_stop", True, 1, ()),
        "garbled": (2, "invalid_format", True, 1, ()),
    }
    assert set(found) == set(expected)
    for case, (step, mode, matched, rollout_step, skipped) in expected.items():
        d = found[case]
        assert (d.state.step, d.state.failure_mode, d.state.prefix_matched, d.rollout_step,
                d.skipped_rollout_steps) == (step, mode, matched, rollout_step, skipped), case
        ref = REFERENCE[step][0]
        assert d.state.reference_action.name == ref.name and d.state.source == "rollout" and d.state.critical
        assert d.state.store_dir == str(reference) and d.state.request_id == f"synthetic.{case}#0@1"
        assert d.state.teacher_label is None and d.state.replay_accuracy is None
    assert found["wrong-element"].category == "wrong_element_same_role"
    assert divergences(reference, rollouts, skip_labels=("detour",), repetition_window=WINDOW) == report.states
    # "*" (config.mine.skip_labels' default: every labelled step) skips the detours as naming them does
    assert find_divergences(reference, rollouts, skip_labels=("*",), repetition_window=WINDOW) == report


def test_without_detour_skipping_the_detour_is_the_divergence(stores):
    reference, rollouts = stores
    found = _by_task(find_divergences(reference, rollouts, skip_labels=(), repetition_window=WINDOW))
    for case in ("wrong-element", "own-detour", "loop", "out-of-steps"):
        d = found[case]  # each reached reference step 1, the wait, with another action (or none)
        assert (d.state.step, d.state.teacher_label, d.state.prefix_matched) == (1, "detour", True), case
    assert found["wrong-element"].state.failure_mode == "wrong_action_type"
    assert found["wait-loop"] is not None and found["wait-loop"].state.step == 2  # its first wait matched


def test_rollout_states_rebuild_the_reference_context(stores, tmp_path):
    reference, rollouts = stores
    states = divergences(reference, rollouts, skip_labels=("detour",), repetition_window=WINDOW)
    path = write_state_set(tmp_path / "states.arrayrecord", states)
    with StateSet(path) as state_set:
        for i, state in enumerate(state_set):
            example = state_set.example(i)
            assert example.step.step == state.step and len(example.history) == state.step  # the skipped detour too
            assert example.target_text == state.reference_text


def test_align_edge_cases():
    # A rollout that ran past the reference's end with every step matched has no divergence.
    ref = _steps("synthetic.x", [(CLICK_NEXT, None)])
    roll = _steps("synthetic.x", [(CLICK_NEXT, None), (CLICK_SUBMIT, None)])
    traj = _attempt("synthetic.x", [(CLICK_NEXT, None), (CLICK_SUBMIT, None)], success=False)[0][0]
    assert align(ref, roll, traj, store_dir="s", skip_labels=("detour",), repetition_window=WINDOW) is None
    # An answer where the reference goes on is a premature stop at that step.
    traj = dataclasses.replace(traj, num_steps=1)
    d = align(_steps("synthetic.x", [(CLICK_NEXT, None), (ANSWER, None)]), _steps("synthetic.x", [(ANSWER, None)]),
              traj, store_dir="s", skip_labels=("detour",), repetition_window=WINDOW)
    assert (d.state.step, d.state.failure_mode, d.category) == (0, "premature_stop", "premature_answer")
