"""salvage.rewards: every reward on every kind of sample (same, near misses, wrong type, unparseable,
truncated), on a hand-built page, through the real parser and compare_actions."""
import pytest

from configs.common import base_config
from rmsweb_jax.salvage.rewards import (NEAR_MISS_CATEGORIES, RewardSettings, SampleScore, score_samples,
                                        token_f1)
from rmsweb_jax.web.action_text import format_action
from rmsweb_jax.web.actions import Action
from rmsweb_jax.web.elements import BBox, Element
from rmsweb_jax.web.observation import Observation

VIEW = (1000, 1000)  # relative coordinates equal CSS pixels
OK = Element(1, "button", "OK", BBox(100, 100, 100, 40), focusable=True, z=3)
CANCEL = Element(2, "button", "Cancel", BBox(200, 100, 100, 40), focusable=True, z=3)
LINK = Element(3, "link", "Help", BBox(400, 100, 50, 20), focusable=True, url="http://x/help")
FIELD = Element(4, "textbox", "Name", BBox(100, 200, 200, 30), focusable=True, z=2)
OBS = Observation(url="http://x/", title="t", screenshot=b"", viewport=VIEW, screenshot_size=VIEW,
                  elements=(OK, CANCEL, LINK, FIELD), focused_id=FIELD.id, instruction="")
CLICK_OK = Action.click(150, 120)
TYPE_ADA = Action.type_text("Ada Lovelace", coordinate=(150, 215))


def settings(kind):
    salvage = base_config().salvage
    salvage.reward = kind
    return RewardSettings.from_config(salvage)


def turn(action, thought="I act."):
    return format_action(action, thought)


# (sampled text, finish reason, reference, category)
CASES = {
    "same_other_point": (turn(Action.click(105, 135)), "stop", CLICK_OK, "same"),
    "same_typing": (turn(Action.type_text(" Ada  Lovelace")), "stop", TYPE_ADA, "same"),
    "wrong_element_same_role": (turn(Action.click(250, 120)), "stop", CLICK_OK, "wrong_element_same_role"),
    "wrong_element_other_role": (turn(Action.click(420, 110)), "stop", CLICK_OK, "wrong_element_other_role"),
    "no_element": (turn(Action.click(900, 900)), "stop", CLICK_OK, "no_element"),
    "wrong_text": (turn(Action.type_text("Ada")), "stop", TYPE_ADA, "wrong_text"),
    "wrong_enter": (turn(Action.type_text("Ada Lovelace", press_enter=True)), "stop", TYPE_ADA, "wrong_enter"),
    "wrong_action_type": (turn(Action("double_click", coordinate=(150, 120))), "stop", CLICK_OK, "wrong_action_type"),
    "premature_answer": (turn(Action.answer_with("done")), "stop", CLICK_OK, "premature_answer"),
    "unparseable": ("I would click OK <tool_call>{not json", "stop", CLICK_OK, "unparseable"),
    "truncated_but_parseable": (turn(CLICK_OK), "length", CLICK_OK, "truncated"),
}


def score(case, kind):
    text, reason, reference, _ = CASES[case]
    (result,) = score_samples([text], reference, OBS, settings(kind), finish_reasons=[reason])
    return result


@pytest.mark.parametrize("case", sorted(CASES))
def test_categories_and_correctness_are_the_same_under_every_reward(case):
    want = CASES[case][3]
    results = [score(case, kind) for kind in ("polarized", "graded", "partial_credit")]
    assert {r.category for r in results} == {want}
    assert {r.correct for r in results} == {want == "same"}


@pytest.mark.parametrize("case", sorted(CASES))
def test_polarized_is_plus_one_for_the_same_action_and_minus_one_otherwise(case):
    assert score(case, "polarized").reward == (1.0 if CASES[case][3] == "same" else -1.0)


@pytest.mark.parametrize("case", sorted(CASES))
def test_graded_softens_only_configured_near_misses(case):
    graded = dict(base_config().salvage.graded)
    category = CASES[case][3]
    got = score(case, "graded").reward
    if category == "same":
        assert got == 1.0
    elif category in graded:
        assert got == graded[category] and -1.0 < got < 0.0
    else:
        assert got == -1.0
    # The near misses the config softens include the ones the issue names.
    assert {"wrong_element_same_role", "wrong_point", "wrong_text"} <= set(graded)


def test_graded_values_come_from_the_settings():
    custom = RewardSettings("graded", {"wrong_element_same_role": -0.25, "wrong_text": -0.75},
                            dict(base_config().salvage.partial_credit))
    texts = [CASES[c][0] for c in ("wrong_element_same_role", "wrong_element_other_role")]
    got = score_samples(texts, CLICK_OK, OBS, custom)
    assert [s.reward for s in got] == [-0.25, -1.0]
    got = score_samples([CASES["wrong_text"][0]], TYPE_ADA, OBS, custom)
    assert got == [SampleScore(False, -0.75, "wrong_text")]


def test_partial_credit_terms():
    w = dict(base_config().salvage.partial_credit)
    total = sum(w.values())
    assert score("same_other_point", "partial_credit").reward == pytest.approx(1.0)
    # Right type, wrong button: format + type + text (a click has none to get wrong), no point.
    assert score("wrong_element_same_role", "partial_credit").reward == pytest.approx(
        (w["format"] + w["action_type"] + w["text"]) / total)
    # Typing "Ada" for "Ada Lovelace": F1 = 2/3 on the text term, the point term granted (same field box).
    wrong_text = score("wrong_text", "partial_credit").reward
    assert wrong_text == pytest.approx((w["format"] + w["action_type"] + w["point"] + w["text"] * 2 / 3) / total)
    assert score("wrong_action_type", "partial_credit").reward == pytest.approx(w["format"] / total)
    assert score("unparseable", "partial_credit").reward == 0.0
    assert score("truncated_but_parseable", "partial_credit").reward == 0.0
    # The baseline's flaw the polarized reward fixes: a wrong action still earns a positive reward.
    assert 0 < score("wrong_element_same_role", "partial_credit").reward < 1


def test_partial_credit_point_in_the_reference_box_or_near_its_point():
    only_point = RewardSettings("partial_credit", {}, {"format": 0, "action_type": 0, "point": 1, "text": 0})
    inside, outside = turn(Action.click(195, 138)), turn(Action.click(203, 120))
    assert [s.reward for s in score_samples([inside, outside], CLICK_OK, OBS, only_point)] == [1.0, 0.0]
    empty = Action.click(900, 900)  # no element there: within POINT_TOLERANCE_PX of the point
    near, far = turn(Action.click(905, 904)), turn(Action.click(920, 900))
    assert [s.reward for s in score_samples([near, far], empty, OBS, only_point)] == [1.0, 0.0]


def test_token_f1():
    assert token_f1("a b c", "a b c") == 1.0
    assert token_f1("", "") == 1.0
    assert token_f1("a", "") == 0.0
    assert token_f1("a a b", "a b b") == pytest.approx(2 / 3)


@pytest.mark.parametrize("kwargs, match", [
    (dict(kind="sparse"), "config.salvage.reward"),
    (dict(graded={"same": -0.5}), "not a near-miss"),
    (dict(graded={"unparseable": -0.5}), "not a near-miss"),
    (dict(graded={"wrong_text": 0.2}), r"\(-1, 0\)"),
    (dict(graded={"wrong_text": -1.0}), r"\(-1, 0\)"),
    (dict(partial_credit={"format": 1.0}), "exactly"),
    (dict(partial_credit={"format": -1.0, "action_type": 1, "point": 1, "text": 1}), ">= 0"),
])
def test_bad_settings_name_the_config_key(kwargs, match):
    base = dict(kind="graded", graded={}, partial_credit=dict(base_config().salvage.partial_credit))
    with pytest.raises(ValueError, match=match):
        RewardSettings(**{**base, **kwargs})


def test_near_miss_categories_exclude_invalid_turns():
    assert "unparseable" not in NEAR_MISS_CATEGORIES and "wrong_action_type" not in NEAR_MISS_CATEGORIES


def test_from_config_and_finish_reason_checks():
    s = RewardSettings.from_config(base_config().salvage)
    assert s.kind == "polarized"
    with pytest.raises(ValueError, match="finish_reason"):
        score_samples(["x"], CLICK_OK, OBS, s, finish_reasons=["eos"])
    with pytest.raises(ValueError, match="finish_reasons"):
        score_samples(["x", "y"], CLICK_OK, OBS, s, finish_reasons=["stop"])
