"""Shared LLM-judge pieces: message parts, the attempt's screenshots and action history, JSON
reading, and the ChatClient adapter against a real HTTP endpoint on 127.0.0.1."""
import http.server
import json
import threading

import pytest

from rmsweb_jax.agents.chat_client import ChatClient
from rmsweb_jax.judges import JudgeInput, WebJudge, WebTailBenchJudge, WebVoyagerJudge, chat_from_client
from rmsweb_jax.judges.llm import (action_history, describe_action, image_bytes, image_part, is_answer, json_object,
                                   trajectory_screenshots)
from rmsweb_jax.web.action_text import format_action
from rmsweb_jax.web.actions import Action
from tests.judges.helpers import ScriptedChat, make_attempt, screenshot, screenshot_index, send_json


def test_image_part_round_trips_png():
    png = screenshot(7)
    part = image_part(png, detail="high")
    assert part["type"] == "image_url" and part["image_url"]["detail"] == "high"
    assert part["image_url"]["url"].startswith("data:image/png;base64,")
    assert screenshot_index(image_bytes(part)) == 7
    with pytest.raises(ValueError, match="non-empty image bytes"):
        image_part(b"")


def test_describe_action_lines():
    click = format_action(Action.click(412, 530), "Press OK.")
    assert describe_action(click) == 'left_click {"coordinate": [412, 530]}'
    typed = format_action(Action.type_text("São Paulo", press_enter=True), "Type the city.")
    assert describe_action(typed) == 'type {"text": "São Paulo", "press_enter": true}'
    assert describe_action(format_action(Action("go_back"))) == "go_back"
    # Not a readable tool call: the agent's text on one line, never dropped.
    assert describe_action("I will click\n<tool_call>{not json</tool_call>") == "I will click {not json"
    assert describe_action("") == "(empty action)"
    assert is_answer(format_action(Action.answer_with("42"))) and not is_answer(format_action(Action.click(1, 2)))


def test_screenshots_and_history_of_an_attempt(webvoyager_tasks):
    task = webvoyager_tasks["Booking--2"]
    answered = make_attempt(task, n_steps=3, answer="Hotel X")
    assert [screenshot_index(s) for s in trajectory_screenshots(answered)] == [0, 1, 2, 3]
    assert action_history(answered) == [f'left_click {{"coordinate": [{100 + i}, {200 + i}]}}' for i in range(3)]
    assert action_history(answered, drop_answer=False)[-1] == 'answer {"text": "Hotel X"}'
    unfinished = make_attempt(task, n_steps=3)
    assert [screenshot_index(s) for s in trajectory_screenshots(unfinished)] == [0, 1, 2, 999]
    same = JudgeInput(task=task, instruction=task.instruction, steps=unfinished.steps,
                      final_screenshot=unfinished.steps[-1].screenshot)
    assert [screenshot_index(s) for s in trajectory_screenshots(same)] == [0, 1, 2]


@pytest.mark.parametrize("text, value", [
    ('{"a": 1}', {"a": 1}), ('Sure.\n```json\n{"a": [1, 2]}\n```', {"a": [1, 2]}),
    ('prose {not json} then {"b": true} end', {"b": True}),
])
def test_json_object_finds_the_object(text, value):
    assert json_object(text) == value


@pytest.mark.parametrize("text", ["", "   ", "no braces", '{"a": ', "[1, 2]"])
def test_json_object_rejects(text):
    with pytest.raises(ValueError):
        json_object(text)


@pytest.mark.parametrize("make", [lambda c: WebVoyagerJudge(c), lambda c: WebJudge(c), lambda c: WebTailBenchJudge(c)])
def test_missing_instruction_is_an_error(webtailbench_tasks, make):
    task = webtailbench_tasks["united_13"]
    attempt = JudgeInput(task=task.__class__(suite="webtailbench", id="x", start_url="", rubric=task.rubric),
                         instruction=" ", steps=make_attempt(task, 2).steps, final_answer="y")
    chat = ScriptedChat("SUCCESS")
    verdict = make(chat).judge(attempt)
    assert verdict.outcome == "error" and "no instruction" in verdict.reason and chat.calls == []


class _CompletionHandler(http.server.BaseHTTPRequestHandler):
    """An OpenAI-style endpoint standing in for the external judge model: it records the request
    and replies with a fixed verdict."""

    requests: list = []

    def do_POST(self):  # noqa: N802 — http.server's naming
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).requests.append(body)
        reply = {"choices": [{"message": {"role": "assistant", "content": "Looks right.\n\nSUCCESS"},
                              "finish_reason": "stop"}], "usage": {"prompt_tokens": 900, "completion_tokens": 5}}
        send_json(self, reply)

    def log_message(self, *args):
        pass


def test_chat_from_client_over_http(webvoyager_tasks):
    _CompletionHandler.requests.clear()  # the test runs once per task source
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _CompletionHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        client = ChatClient(f"http://127.0.0.1:{server.server_port}/v1", "judge-model", timeout_s=10, max_retries=0)
        judge = WebVoyagerJudge(chat_from_client(client, max_tokens=1000))
        attempt = make_attempt(webvoyager_tasks["Coursera--4"], n_steps=2, answer="Course A")
        verdict = judge.judge(attempt)
    finally:
        server.shutdown()
        server.server_close()
    assert verdict.outcome == "success" and verdict.calls == 1
    [request] = _CompletionHandler.requests
    assert request["model"] == "judge-model" and request["max_tokens"] == 1000 and request["temperature"] == 0
    assert request["messages"] == judge.build_messages(attempt)
    with pytest.raises(ValueError, match="max_tokens"):
        chat_from_client(client, max_tokens=0)
