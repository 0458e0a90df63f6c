"""WebTailBench rubric judge: the rubric prompt from Stagehand records (fixture and real), per-criterion JSON
parsing, conditional criteria, earned/max against the 0.8 threshold, and malformed replies."""
import dataclasses
import json

import pytest

from rmsweb_jax.judges import WebTailBenchJudge
from rmsweb_jax.judges.webtailbench import parse_rubric_scores
from rmsweb_jax.judges.llm import JudgeFailure
from tests.judges.helpers import ScriptedChat, images_in, make_attempt, text_of

ANSWER = "United's nonstop ORD-GRU on 12/01/2025: economy $1,050, business $4,300; difference $3,250."


def reply_for(task, points, condition_met=None, **extra) -> str:
    """Returns a judge reply filling the task's rubric with `points` (one per criterion)."""
    items = []
    for item, earned in zip(task.rubric, points):
        entry = {"criterion": item.criterion, "description": item.description, "max_points": item.max_points,
                 "justification": f"Checked {item.criterion[:20]}.", "earned_points": earned}
        if item.condition:
            entry["condition"] = item.condition
            entry["is_condition_met"] = condition_met
        items.append(entry | extra)
    return json.dumps({"items": items}, indent=2)


@pytest.fixture(scope="module")
def united(webtailbench_tasks):
    return webtailbench_tasks["united_13"]  # 4 plain criteria (11 points) + 1 conditional (3 points)


def test_prompt_carries_task_rubric_actions_answer_and_last_screenshots(united):
    chat = ScriptedChat(reply_for(united, [4, 2, 2, 1, 0], condition_met=False))
    record = WebTailBenchJudge(chat).evaluate(make_attempt(united, n_steps=5, answer=ANSWER))
    [messages] = chat.calls
    assert len(messages) == 1 and messages[0]["role"] == "user"
    text = text_of(messages[0])
    assert f"Task: {united.instruction}\n" in text
    rubric_block = text.split("Rubric: >>>\n", 1)[1].split("\n<<<", 1)[0]
    shown = json.loads(rubric_block)["items"]
    assert [i["criterion"] for i in shown] == [r.criterion for r in united.rubric]
    assert [i["max_points"] for i in shown] == [4, 2, 2, 3, 3]
    assert all(i["justification"] == "" and i["earned_points"] == "" for i in shown)
    assert list(shown[4]) == ["criterion", "condition", "description", "max_points", "justification", "earned_points"]
    assert shown[4]["condition"] == united.rubric[4].condition and "condition" not in shown[0]
    assert shown[1]["description"] == united.rubric[1].description
    assert 'Action History: >>>\n1. left_click {"coordinate": [100, 200]}\n' in text
    assert '5. left_click {"coordinate": [104, 204]}\n<<<' in text  # the answer is the output, not an action
    assert f"Agent Output: >>>\n{ANSWER}\n<<<" in text
    assert images_in(messages) == [3, 4, 5] and "The last 3 screenshots" in text

    # Condition unmet: the conditional criterion is out of both totals: 9/11 = 0.818 >= 0.8.
    verdict = record.verdict
    assert verdict.outcome == "success" and verdict.score == pytest.approx(9 / 11) and verdict.calls == 1
    assert [s.counted for s in record.items] == [True, True, True, True, False]
    assert "rubric 9/11 = 0.818 >= 0.8" in verdict.reason and "(condition unmet)" in verdict.reason


def test_condition_met_counts_and_threshold_decides(united):
    attempt = make_attempt(united, n_steps=2, answer="No direct flights on those dates.")
    met = WebTailBenchJudge(ScriptedChat(reply_for(united, [4, 2, 2, 1, 0], condition_met=True))).judge(attempt)
    assert met.outcome == "failure" and met.score == pytest.approx(9 / 14)
    at_threshold = reply_for(united, [4, 2, 2, 1.2, 2], condition_met=True)  # 11.2 / 14 = 0.8 (0.79999... in floats)
    assert WebTailBenchJudge(ScriptedChat(at_threshold)).judge(attempt).outcome == "success"
    strict = WebTailBenchJudge(ScriptedChat(at_threshold), threshold=0.9).judge(attempt)
    assert strict.outcome == "failure" and strict.score == pytest.approx(0.8)


def test_lenient_but_exact_readings(united):
    attempt = make_attempt(united, n_steps=1, answer=ANSWER)
    reply = reply_for(united, ["4", "2", "1.5", "3", "0"], condition_met="false")  # numbers and booleans as strings
    fenced = f"Here is the scored rubric:\n```json\n{reply}\n```\nDone."
    verdict = WebTailBenchJudge(ScriptedChat(fenced)).judge(attempt)
    assert verdict.outcome == "success" and verdict.score == pytest.approx(10.5 / 11)
    # Items named back in another order are matched by criterion.
    reordered = json.loads(reply)
    reordered["items"].reverse()
    scores = parse_rubric_scores(json.dumps(reordered), united.rubric)
    assert [s.earned_points for s in scores] == [4, 2, 1.5, 3, 0]


@pytest.mark.parametrize("reply, expected", [
    ("", "expected a JSON object"),
    ("The agent did well; I award 10 of 14 points.", "expected a JSON object"),
    ('{"items": [{"criterion": "Use correct flight constraints", "earned_points": 4', "expected a JSON object"),
    ('{"total_earned_points": 11, "total_max_points": 14}', "expected key 'items'"),
    ('{"items": [{"criterion": "Use correct flight constraints", "earned_points": 4}]}', "expected 5 scored criteria"),
])
def test_malformed_replies_are_errors(united, reply, expected):
    verdict = WebTailBenchJudge(ScriptedChat(reply)).judge(make_attempt(united, 2, answer=ANSWER))
    assert verdict.outcome == "error" and not verdict.success and verdict.raw == reply and verdict.calls == 1
    assert expected in verdict.reason


@pytest.mark.parametrize("points, condition_met, expected", [
    ([5, 2, 2, 1, 0], False, "earned_points a number in 0..4, got 5"),
    ([4, -1, 2, 1, 0], False, "earned_points a number in 0..2, got -1"),
    ([4, 2, "", 1, 0], False, "earned_points a number in 0..2, got ''"),
    ([4, 2, 2, None, 0], False, "earned_points a number in 0..3, got None"),
    ([4, 2, 10**400, 1, 0], False, "earned_points a number in 0..2, got 1000"),  # JSON ints are unbounded
    ([4, 2, 2, 1, 0], None, "expected is_condition_met true or false, got None"),
    ([4, 2, 2, 1, 0], "maybe", "expected is_condition_met true or false, got 'maybe'"),
])
def test_points_out_of_range_or_missing_fields_are_errors(united, points, condition_met, expected):
    verdict = WebTailBenchJudge(ScriptedChat(reply_for(united, points, condition_met))).judge(
        make_attempt(united, 2, answer=ANSWER))
    assert verdict.outcome == "error" and expected in verdict.reason
    assert "criterion" in verdict.reason  # names the criterion at fault


def test_no_applicable_criterion_is_an_error(united):
    only_conditional = dataclasses.replace(united, rubric=united.rubric[4:])
    reply = reply_for(only_conditional, [0], condition_met=False)
    verdict = WebTailBenchJudge(ScriptedChat(reply)).judge(make_attempt(only_conditional, 1, answer=ANSWER))
    assert verdict.outcome == "error" and "no criterion counts" in verdict.reason


def test_task_without_rubric_is_an_error_without_a_call(benchmark_files):
    from rmsweb_jax.suites import load_webtailbench
    molmo = load_webtailbench(benchmark_files / "webtailbench" / "molmoweb_webtailbench.json")[0]
    chat = ScriptedChat("{}")
    verdict = WebTailBenchJudge(chat).judge(make_attempt(molmo, 2, answer="x"))
    assert verdict.outcome == "error" and verdict.calls == 0 and chat.calls == []
    assert "has no rubric" in verdict.reason and molmo.id in verdict.reason


def test_text_only_form_and_missing_answer(webtailbench_tasks):
    task = webtailbench_tasks["michaels_2250"]
    chat = ScriptedChat(reply_for(task, [r.max_points for r in task.rubric], condition_met=True))
    verdict = WebTailBenchJudge(chat, max_screenshots=0).judge(make_attempt(task, 3))
    assert verdict.outcome == "success" and verdict.score == 1.0
    assert images_in(chat.calls[0]) == [] and "screenshots" not in text_of(chat.calls[0][0]).split("<<<")[-1]
    assert "Agent Output: >>>\n(the agent gave no final answer)\n<<<" in text_of(chat.calls[0][0])


def test_parse_rubric_scores_raises_judge_failure(united):
    with pytest.raises(JudgeFailure, match="no complete JSON object"):
        parse_rubric_scores('```json\n{"items": [\n```', united.rubric)
