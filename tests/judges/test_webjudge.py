"""WebJudge (Online-Mind2Web): key points, one relevance call per screenshot with keep >= 3 / max 50,
and the final verdict — prompts from task records (fixture and real), parsers on the official output formats."""
import pytest

from rmsweb_jax.judges import WebJudge
from rmsweb_jax.judges import webjudge_prompts as prompts
from rmsweb_jax.judges.webjudge import parse_image_score, parse_key_points, parse_status
from tests.judges.helpers import ScriptedChat, images_in, make_attempt, text_of

KEY_POINTS_REPLY = "**Key Points**:\n\n1. Search for flights\n   2. Filter by cheapest\n3. Show results"
KEY_POINTS = "\n1. Search for flights\n2. Filter by cheapest\n3. Show results"  # as the original cuts it


def scripted_judge(score_of, final='Thoughts: every key point is met.\nStatus: "success"'):
    """Returns a chat callable answering each WebJudge call the way the judge model would."""
    def reply(messages):
        system = messages[0]["content"]
        if system == prompts.KEY_POINTS_SYSTEM:
            return KEY_POINTS_REPLY
        if system == prompts.IMAGE_SYSTEM:
            [index] = images_in(messages)
            score = score_of(index)
            return (f"1. **Reasoning**: Screenshot {index} shows\nthe results list.\n\nMore detail.\n"
                    f"2. **Score**: {score}")
        if system == prompts.FINAL_SYSTEM:
            return final
        raise AssertionError(f"unexpected system prompt {system[:60]!r}")
    return ScriptedChat(reply)


def test_three_steps_from_a_real_task(mind2web_tasks):
    task = next(iter(mind2web_tasks.values()))
    attempt = make_attempt(task, n_steps=5, answer="The cheapest flight is $120.")
    scores = {0: 1, 1: 3, 2: 2, 3: 5, 4: 4, 5: 3}  # screenshot 5 is the answer step's
    chat = scripted_judge(scores.get)
    record = WebJudge(chat, workers=3).evaluate(attempt)
    verdict = record.verdict
    assert verdict.outcome == "success" and verdict.calls == 1 + 6 + 1 == len(chat.calls)
    assert record.key_points == KEY_POINTS
    assert [s.score for s in record.image_scores] == [1, 3, 2, 5, 4, 3]
    assert record.kept == (1, 3, 4, 5)

    key_call = chat.calls[0]
    assert key_call[1]["content"] == [{"type": "text", "text": f"Task: {task.instruction}"}]
    image_calls = [c for c in chat.calls if c[0]["content"] == prompts.IMAGE_SYSTEM]
    assert sorted(i for c in image_calls for i in images_in(c)) == [0, 1, 2, 3, 4, 5]  # one image per call
    for call in image_calls:
        assert text_of(call[1]) == (f"**Task**: {task.instruction}\n\n**Key Points for Task Completion**: {KEY_POINTS}"
                                    "\n\nThe snapshot of the web page is shown in the image.")
        assert call[1]["content"][1]["image_url"]["detail"] == "high"

    final = chat.calls[-1]
    assert final[0]["content"] == prompts.FINAL_SYSTEM
    text = text_of(final[1])
    assert text.startswith(f"User Task: {task.instruction}\n\nKey Points: {KEY_POINTS}\n\nAction History:\n"
                           '1. left_click {"coordinate": [100, 200]}\n2. left_click {"coordinate": [101, 201]}\n')
    assert '5. left_click {"coordinate": [104, 204]}\n\nThe potentially important' in text  # answer left out
    assert "answer" not in text and "$120" not in text
    # The kept screenshots' reasons: first paragraph after **Reasoning**, on one line, numbered.
    assert text.endswith("their reasons:\n1. Screenshot 1 shows the results list.\n2. Screenshot 3 shows the results "
                         "list.\n3. Screenshot 4 shows the results list.\n4. Screenshot 5 shows the results list.")
    assert images_in(final) == [1, 3, 4, 5]


def test_keep_at_least_3_and_at_most_50_of_many_screenshots(mind2web_tasks):
    task = list(mind2web_tasks.values())[7]
    attempt = make_attempt(task, n_steps=120, final=True)  # no answer: the final page (999) is scored too
    score_of = lambda i: 5 if i == 999 else i % 5 + 1  # noqa: E731 — scores 1..5 in turn
    chat = scripted_judge(score_of, final='Thoughts: filters missing.\nStatus: "failure"')
    record = WebJudge(chat).evaluate(attempt)
    assert record.verdict.outcome == "failure" and record.verdict.calls == 1 + 121 + 1
    eligible = [i for i in range(120) if i % 5 + 1 >= 3] + [999]
    assert len(eligible) == 73
    assert list(record.kept) == [i for i in eligible][:50] and max(record.kept) < 120
    assert images_in(chat.calls[-1]) == eligible[:50]
    assert text_of(chat.calls[-1][1]).count(" shows the results list.") == 50

    strict = scripted_judge(score_of)
    record = WebJudge(strict, score_threshold=5, max_images=3).evaluate(attempt)
    assert list(record.kept) == [4, 9, 14]
    assert "3/121 screenshots kept (score >= 5, max 3)" in record.verdict.reason


def test_no_screenshot_kept_uses_the_original_no_image_prompt(mind2web_tasks):
    task = list(mind2web_tasks.values())[3]
    chat = scripted_judge(lambda i: 2)
    verdict = WebJudge(chat).judge(make_attempt(task, n_steps=3, answer="done"))
    assert verdict.outcome == "success"
    final = chat.calls[-1]
    assert images_in(final) == [] and "potentially important" not in text_of(final[1])
    assert text_of(final[1]).endswith('Action History:\n1. left_click {"coordinate": [100, 200]}\n'
                                      '2. left_click {"coordinate": [101, 201]}\n'
                                      '3. left_click {"coordinate": [102, 202]}')


def test_unreadable_screenshot_score_counts_zero_or_errors_when_strict(mind2web_tasks):
    task = list(mind2web_tasks.values())[11]
    attempt = make_attempt(task, n_steps=3, answer="ok")

    def reply(messages):
        system = messages[0]["content"]
        if system == prompts.IMAGE_SYSTEM:
            [index] = images_in(messages)
            return "**Reasoning**: unclear.\n**Score**: 7" if index == 1 else "**Reasoning**: yes.\n**Score**: 4"
        return KEY_POINTS_REPLY if system == prompts.KEY_POINTS_SYSTEM else 'Status: "success"'

    record = WebJudge(ScriptedChat(reply)).evaluate(attempt)
    assert record.verdict.outcome == "success" and record.kept == (0, 2, 3)
    assert "no readable score for screenshots [1] (counted 0)" in record.verdict.reason
    strict = WebJudge(ScriptedChat(reply), strict_scores=True).judge(attempt)
    assert strict.outcome == "error" and "screenshot 1: expected 'Score: N' with N in 1..5" in strict.reason
    assert strict.raw.endswith("**Score**: 7")


@pytest.mark.parametrize("final", ["", "Thoughts: the agent applied the filter.", 'Status: "success" or "failure"',
                                   "Status: pending", "Status: unsuccessful", "Thoughts: ok\nStatus: \""])
def test_unreadable_final_status_is_an_error(mind2web_tasks, final):
    task = list(mind2web_tasks.values())[5]
    verdict = WebJudge(scripted_judge(lambda i: 3, final=final)).judge(make_attempt(task, 2, answer="x"))
    assert verdict.outcome == "error" and verdict.raw == final and verdict.calls == 1 + 3 + 1
    assert "expected a final line 'Status: \"success\"' or 'Status: \"failure\"'" in verdict.reason


def test_endpoint_failure_midway_is_an_error(mind2web_tasks):
    task = list(mind2web_tasks.values())[9]

    def reply(messages):
        if messages[0]["content"] == prompts.IMAGE_SYSTEM:
            raise TimeoutError("read timed out after 60 s")
        return KEY_POINTS_REPLY

    verdict = WebJudge(ScriptedChat(reply), workers=1).judge(make_attempt(task, 4, answer="x"))
    assert verdict.outcome == "error" and "TimeoutError: read timed out" in verdict.reason
    assert verdict.calls >= 2  # the key-point call and at least the failing screenshot call
    empty = WebJudge(ScriptedChat("")).judge(make_attempt(task, 4, answer="x"))
    assert empty.outcome == "error" and "expected a numbered list of key points" in empty.reason and empty.calls == 1


@pytest.mark.parametrize("reply, points", [
    (KEY_POINTS_REPLY, KEY_POINTS),
    ("Here they are.\nKey Points:\n1. Go to the site\n2. Open the deals", "\n1. Go to the site\n2. Open the deals"),
    ("1. Only a list", "1. Only a list"),
])
def test_key_point_cut(reply, points):
    assert parse_key_points(reply) == points


@pytest.mark.parametrize("reply, score", [
    ("1. **Reasoning**: Shows the cart.\n2. **Score**: 4", 4), ("**Score**: [5]", 5), ("Score: 3/5", 3),
    ("Score (1-5): 2", 2), ("score: 1", 1), ("I would score it 2 at first.\n**Score**: 4\n\nThis score fits.", 4),
    ("**Score**: 4.0", 4), ("Score: 0", None), ("Score: 7", None), ("Score: 10", None), ("Score: 4.5", None),
    ("The image shows a search page.", None), ("", None), ("**Score**:", None),
])
def test_image_score_formats(reply, score):
    assert parse_image_score(reply) == score


@pytest.mark.parametrize("reply, status", [
    ('Thoughts: all key points met.\nStatus: "success"', "success"),
    ('Thoughts: no filter.\nStatus: "failure"', "failure"),
    ("Status: success", "success"), ('**Status**: "failure"', "failure"), ('**Status:**\n"success"', "success"),
    ("status: Success.", "success"), ("STATUS: FAILURE", "failure"),
    ("Status: success at first glance, but...\nFinal Status: failure", "failure"),
    ('Status: "success" or "failure"', None), ("Thoughts: the agent succeeded", None), ("", None),
    ("Status: pending", None), ("Status: unsuccessful", None), ("Status:", None),
])
def test_status_formats(reply, status):
    assert parse_status(reply) == status
