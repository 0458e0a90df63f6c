"""The failure-mode taxonomy: every compare_actions category, parse errors and episode ends land on the
documented mode, through real sampled turns parsed and compared on a real page's elements."""
import pytest

from rmsweb_jax.collect.store_fixture import attempt_steps, page_elements
from rmsweb_jax.mining.taxonomy import (
    CATEGORY_MODES, TAXONOMY, category_failure_mode, episode_failure_mode, majority_failure_mode, sample_failure_mode)
from rmsweb_jax.web.action_text import format_action, parse_action
from rmsweb_jax.web.actions import RELATIVE, Action
from rmsweb_jax.web.semantics import CATEGORIES, compare_actions, resolve_on

VIEWPORT = (500, 240)
ELEMENTS = page_elements(VIEWPORT, 0)  # textbox "Word", then buttons Submit, Cancel, Next, Back


def _at(name: str) -> tuple[int, int]:
    element = next(e for e in ELEMENTS if e.name == name)
    return RELATIVE.from_css(element.bbox.center, VIEWPORT)


def _observation():
    step = attempt_steps("t", 0, 1, success=True, viewport=VIEWPORT, variant=0)[1]
    return step.observation()


CLICK_SUBMIT = Action.click(*_at("Submit"))
TYPE_ALPHA = Action.type_text("alpha", coordinate=_at("Word"))
# (reference, sampled turn, expected category, expected failure mode)
CASES = [
    (CLICK_SUBMIT, format_action(Action.click(*_at("Submit")), "press it"), "same", None),
    (CLICK_SUBMIT, "I press Submit <tool_call>{oops", "unparseable", "invalid_format"),
    (CLICK_SUBMIT, format_action(Action("key", keys=("Enter",))), "wrong_action_type", "wrong_action_type"),
    (CLICK_SUBMIT, format_action(Action.answer_with("done")), "premature_answer", "premature_stop"),
    (CLICK_SUBMIT, format_action(Action.click(*_at("Cancel"))), "wrong_element_same_role", "wrong_element"),
    (CLICK_SUBMIT, format_action(Action.click(*_at("Word"))), "wrong_element_other_role", "wrong_element"),
    (CLICK_SUBMIT, format_action(Action.click(990, 980)), "no_element", "wrong_element"),
    (Action.click(980, 980), format_action(Action.click(10, 980)), "wrong_point", "wrong_element"),
    (TYPE_ALPHA, format_action(Action.type_text("bravo", coordinate=_at("Word"))), "wrong_text", "wrong_text"),
    (TYPE_ALPHA, format_action(Action.type_text("alpha", coordinate=_at("Word"), press_enter=True)), "wrong_enter",
     "wrong_text"),
    (Action.type_text("alpha", coordinate=_at("Word"), clear=True), format_action(TYPE_ALPHA), "wrong_clear",
     "wrong_text"),
    (Action("key", keys=("Enter",)), format_action(Action("key", keys=("Tab",))), "wrong_key", "wrong_text"),
    (Action("scroll", direction="down", amount=100), format_action(Action("scroll", direction="up", amount=100)),
     "wrong_scroll", "wrong_text"),
    (Action("navigate", url="http://127.0.0.1/a"), format_action(Action("navigate", url="http://127.0.0.1/b")),
     "wrong_url", "wrong_text"),
    (Action.answer_with("done"), format_action(Action.answer_with("not done")), "wrong_answer", "wrong_answer"),
]


def test_the_cases_cover_every_category():
    assert {c[2] for c in CASES} == set(CATEGORIES)


@pytest.mark.parametrize("reference,turn,category,mode", CASES, ids=[c[2] for c in CASES])
def test_a_sampled_turn_lands_on_its_failure_mode(reference, turn, category, mode):
    observation = _observation()
    reference = resolve_on(reference, observation)  # stored reference actions carry their semantic target
    parsed = parse_action(turn, observation.coordinate_space)
    outcome = parsed if not parsed.ok else compare_actions(parsed, reference, observation)
    assert (outcome.category if parsed.ok else "unparseable") == category
    assert sample_failure_mode(outcome) == mode
    assert category_failure_mode(category) == mode


def test_every_category_maps_into_the_taxonomy_and_unknown_names_are_refused():
    assert set(CATEGORY_MODES) == set(CATEGORIES) - {"same"}
    assert set(CATEGORY_MODES.values()) <= set(TAXONOMY)
    with pytest.raises(ValueError, match="'wrong_colour' is not a compare_actions category"):
        category_failure_mode("wrong_colour")


@pytest.mark.parametrize("reason", ["no_tool_call", "invalid_json", "unknown_action", "coordinate_out_of_range"])
def test_every_parse_error_is_invalid_format(reason):
    turns = {"no_tool_call": "I will click Submit.", "invalid_json": "x <tool_call>{oops</tool_call>",
             "unknown_action": '<tool_call>{"name": "computer_use", "arguments": {"action": "fly"}}</tool_call>',
             "coordinate_out_of_range": format_action(Action.click(5, 5)).replace("[5, 5]", "[5000, 5]")}
    parsed = parse_action(turns[reason])
    assert not parsed.ok and parsed.reason == reason
    assert sample_failure_mode(parsed) == "invalid_format"


def test_episode_ends():
    click = format_action(CLICK_SUBMIT)
    other = format_action(Action.click(*_at("Cancel")))
    assert episode_failure_mode([other, click, click, click], truncated=True, window=3) == "repetition_loop"
    assert episode_failure_mode([other, click, click, click], truncated=False, window=3) == "repetition_loop"
    assert episode_failure_mode([click, other, click, click], truncated=True, window=3) == "out_of_steps"
    assert episode_failure_mode([click, click], truncated=True, window=3) == "out_of_steps"  # too short to loop
    assert episode_failure_mode([other, click], truncated=False, window=3) is None
    with pytest.raises(ValueError, match="window of at least 2"):
        episode_failure_mode([click], truncated=True, window=1)


def test_majority_failure_mode_counts_wrong_samples_and_breaks_ties_by_taxonomy_order():
    assert majority_failure_mode([None, "wrong_text", "wrong_element", "wrong_text"]) == "wrong_text"
    assert majority_failure_mode(["wrong_text", "wrong_element"]) == "wrong_element"  # listed first in TAXONOMY
    assert majority_failure_mode([None, None]) is None
    with pytest.raises(ValueError, match="not in TAXONOMY"):
        majority_failure_mode(["routine"])


def test_a_category_missing_from_the_map_fails_at_import(monkeypatch):
    import importlib

    import rmsweb_jax.mining.taxonomy as taxonomy
    import rmsweb_jax.web.semantics as semantics
    monkeypatch.setattr(semantics, "CATEGORIES", (*semantics.CATEGORIES, "wrong_colour"))
    with pytest.raises(ImportError, match="wrong_colour"):
        importlib.reload(taxonomy)
    monkeypatch.undo()
    importlib.reload(taxonomy)
    assert "wrong_colour" not in taxonomy.CATEGORY_MODES
