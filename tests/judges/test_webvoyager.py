"""WebVoyager judge: the official prompt built from task records (fixture and real), and the official parser."""
import pytest

from rmsweb_jax.judges import WebVoyagerJudge
from rmsweb_jax.judges.webvoyager import SYSTEM_PROMPT, parse_webvoyager_verdict
from tests.judges.helpers import ScriptedChat, images_in, make_attempt, text_of

JUDGE_SAYS_SUCCESS = ("The screenshots show the recipe page for 'Vegetarian Four Cheese Lasagna' with 4.6 stars "
                      "and 181 reviews, matching the response.\n\nVerdict: SUCCESS")


def test_prompt_carries_task_answer_and_exactly_the_last_k_screenshots(webvoyager_tasks):
    task = webvoyager_tasks["Allrecipes--0"]
    answer = task.reference_answer  # a real answer string of the benchmark
    chat = ScriptedChat(JUDGE_SAYS_SUCCESS)
    verdict = WebVoyagerJudge(chat).judge(make_attempt(task, n_steps=6, answer=answer))
    assert verdict.outcome == "success" and verdict.calls == 1 and verdict.raw == JUDGE_SAYS_SUCCESS
    [messages] = chat.calls
    assert messages[0] == {"role": "system", "content": SYSTEM_PROMPT}
    user = messages[1]["content"]
    assert user[0] == {"type": "text", "text": f"TASK: {task.instruction}\nResult Response: {answer}\n"
                                               f"3 screenshots at the end: "}
    # Steps 0..5 clicked, step 6 answered on the page it saw; the answer leaves the page as it was,
    # so the final screenshot (999) adds nothing and the last three are 4, 5, 6.
    assert images_in(messages) == [4, 5, 6]
    assert [p["type"] for p in user] == ["text", "image_url", "image_url", "image_url", "text"]
    assert user[-1] == {"type": "text", "text": "Your verdict:\n"}
    assert user[1]["image_url"]["url"].startswith("data:image/png;base64,")


@pytest.mark.parametrize("k, expected", [(1, [6]), (15, [0, 1, 2, 3, 4, 5, 6])])
def test_k_is_configurable_and_never_claims_missing_screenshots(webvoyager_tasks, k, expected):
    task = webvoyager_tasks["GitHub--3"]
    chat = ScriptedChat("NOT SUCCESS")
    verdict = WebVoyagerJudge(chat, max_screenshots=k).judge(make_attempt(task, n_steps=6, answer="42 stars"))
    assert verdict.outcome == "failure"
    assert images_in(chat.calls[0]) == expected
    assert f"\n{len(expected)} screenshots at the end: " in text_of(chat.calls[0][1])


def test_final_screenshot_counts_when_the_attempt_ran_out_of_steps(webvoyager_tasks):
    # No answer action: the page after the last click is new evidence (it is attached last).
    judge = WebVoyagerJudge(ScriptedChat("SUCCESS"), require_answer=False)
    messages = judge.build_messages(make_attempt(webvoyager_tasks["Amazon--5"], n_steps=4))
    assert images_in(messages) == [2, 3, 999]
    assert "Result Response: \n" in text_of(messages[1])


def test_no_answer_fails_without_a_call_as_the_official_script_does(webvoyager_tasks):
    chat = ScriptedChat("SUCCESS")
    verdict = WebVoyagerJudge(chat).judge(make_attempt(webvoyager_tasks["Amazon--5"], n_steps=4))
    assert verdict.outcome == "failure" and verdict.calls == 0 and chat.calls == []
    assert "no final answer" in verdict.reason


@pytest.mark.parametrize("reply, outcome", [
    ("Thoughts...\n\nSUCCESS", "success"),
    ("The agent found the right page. Verdict: SUCCESS.", "success"),
    ("Result: NOT SUCCESS", "failure"),
    ("**Verdict:** NOT SUCCESS — the price is missing", "failure"),
    # Both words: the official parser checks 'NOT SUCCESS' first.
    ("It is not SUCCESS on step 2 ... final verdict: SUCCESS. Earlier draft said NOT SUCCESS", "failure"),
    ("", None), ("The task was completed.", None),
    ("success", None),  # the official check is case-sensitive
])
def test_official_parser(reply, outcome):
    assert parse_webvoyager_verdict(reply) == outcome


@pytest.mark.parametrize("reply", ["", "I cannot judge this.", "success (lower case)"])
def test_unreadable_reply_is_a_recorded_error(webvoyager_tasks, reply):
    verdict = WebVoyagerJudge(ScriptedChat(reply)).judge(make_attempt(webvoyager_tasks["ArXiv--1"], 3, answer="x"))
    assert verdict.outcome == "error" and not verdict.success
    assert verdict.raw == reply and verdict.calls == 1
    assert "expected 'SUCCESS' or 'NOT SUCCESS'" in verdict.reason


def test_endpoint_failure_is_an_error_not_a_success(webvoyager_tasks):
    def down(messages):
        raise ConnectionRefusedError("127.0.0.1:8000 refused")

    verdict = WebVoyagerJudge(down).judge(make_attempt(webvoyager_tasks["ArXiv--1"], 3, answer="x"))
    assert verdict.outcome == "error" and verdict.calls == 1
    assert "ConnectionRefusedError" in verdict.reason and "127.0.0.1:8000" in verdict.reason
    none_text = WebVoyagerJudge(lambda m: None).judge(make_attempt(webvoyager_tasks["ArXiv--1"], 3, answer="x"))
    assert none_text.outcome == "error" and "returned NoneType" in none_text.reason


def test_placeholders_inside_the_answer_stay_as_written(webvoyager_tasks):
    messages = WebVoyagerJudge(ScriptedChat("SUCCESS")).build_messages(
        make_attempt(webvoyager_tasks["Apple--0"], n_steps=1, answer="Use <num> and <task> tags"))
    assert "Result Response: Use <num> and <task> tags\n2 screenshots at the end: " in text_of(messages[1])
