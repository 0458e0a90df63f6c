"""Judge token counts: every LLM judge's Verdict carries the calls it made and the prompt /
completion tokens the endpoint reported for them (summed over WebJudge's concurrent calls, kept
on error verdicts), read through chat_from_client from a real OpenAI-compatible server on 127.0.0.1."""
import contextlib
import http.server
import json
import threading

import pytest

from rmsweb_jax.agents.chat_client import ChatClient
from rmsweb_jax.judges import WebJudge, WebTailBenchJudge, WebVoyagerJudge, chat_from_client
from rmsweb_jax.judges.base import Verdict
from rmsweb_jax.judges.llm import ChatSession, JudgeFailure
from tests.judges.helpers import ScriptedChat, make_attempt, send_json
from tests.judges.test_webjudge import scripted_judge
from tests.judges.test_webtailbench import reply_for


class _Endpoint(http.server.BaseHTTPRequestHandler):
    """An OpenAI-style chat endpoint: the text comes from the server's `reply(messages)`, the usage
    differs per call (prompt tokens from the request's size, completion tokens from the reply's)
    and every call's (prompt, completion) counts are recorded."""

    def do_POST(self):  # noqa: N802 — http.server's naming
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        text = self.server.reply(body["messages"])
        cut = text is None  # None: an empty reply cut at max_tokens
        usage = (len(json.dumps(body["messages"])) // 7 + 11,
                 body["max_tokens"] if cut else len(text.split()) + 3)
        with self.server.lock:
            self.server.usages.append(usage)
        send_json(self, {"choices": [{"message": {"role": "assistant", "content": "" if cut else text},
                                      "finish_reason": "length" if cut else "stop"}],
                         "usage": {"prompt_tokens": usage[0], "completion_tokens": usage[1]}})

    def log_message(self, *args):
        pass


@contextlib.contextmanager
def endpoint(reply, *, max_tokens: int = 512):
    """Yields (chat callable over a real ChatClient, the server) for a server answering with `reply`."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Endpoint)
    server.reply, server.usages, server.lock = reply, [], threading.Lock()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        client = ChatClient(f"http://127.0.0.1:{server.server_port}/v1", "judge-model", timeout_s=20, max_retries=0)
        yield chat_from_client(client, max_tokens=max_tokens), server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def _sums(server) -> tuple[int, int]:
    return sum(p for p, _ in server.usages), sum(c for _, c in server.usages)


def test_webjudge_sums_tokens_over_its_concurrent_calls(mind2web_tasks):
    task = next(iter(mind2web_tasks.values()))
    attempt = make_attempt(task, n_steps=6, answer="The cheapest flight is $120.")
    with endpoint(scripted_judge(lambda i: 1 + i % 5).reply) as (chat, server):
        verdict = WebJudge(chat, workers=4).judge(attempt)
    # key points + one call per screenshot (6 steps + the answer step's) + the verdict
    assert verdict.outcome == "success" and verdict.calls == len(server.usages) == 1 + 7 + 1
    assert len(set(server.usages)) > 1  # the calls report different counts: a sum, not one call's
    assert (verdict.prompt_tokens, verdict.completion_tokens) == _sums(server)
    assert verdict.prompt_tokens > 0 and verdict.completion_tokens > 0
    again = Verdict.from_dict(json.loads(json.dumps(verdict.to_dict())))
    assert again == verdict


def test_webvoyager_tokens_on_success_and_on_an_unreadable_reply(webvoyager_tasks):
    attempt = make_attempt(webvoyager_tasks["Coursera--4"], n_steps=3, answer="Course A")
    with endpoint(lambda messages: "The screenshots show the course.\n\nSUCCESS") as (chat, server):
        verdict = WebVoyagerJudge(chat).judge(attempt)
    assert verdict.outcome == "success" and verdict.calls == 1
    assert (verdict.prompt_tokens, verdict.completion_tokens) == server.usages[0]
    # The reply cannot be read: an error verdict, but the call and its tokens were spent.
    with endpoint(lambda messages: "I am not sure.") as (chat, server):
        verdict = WebVoyagerJudge(chat).judge(attempt)
    assert verdict.outcome == "error" and verdict.calls == 1
    assert (verdict.prompt_tokens, verdict.completion_tokens) == server.usages[0] != (0, 0)
    # No final answer: decided without a call, so nothing spent.
    verdict = WebVoyagerJudge(ScriptedChat("SUCCESS")).judge(make_attempt(webvoyager_tasks["Coursera--4"], 2))
    assert verdict.outcome == "failure"
    assert (verdict.calls, verdict.prompt_tokens, verdict.completion_tokens) == (0, 0, 0)


def test_webtailbench_tokens_and_a_reply_cut_at_max_tokens(webtailbench_tasks):
    united = webtailbench_tasks["united_13"]
    attempt = make_attempt(united, n_steps=4, answer="economy $1,050, business $4,300")
    with endpoint(lambda messages: reply_for(united, [4, 2, 2, 1, 0], condition_met=False)) as (chat, server):
        verdict = WebTailBenchJudge(chat).judge(attempt)
    assert verdict.outcome == "success" and verdict.calls == 1
    assert (verdict.prompt_tokens, verdict.completion_tokens) == server.usages[0]
    # An empty reply cut at max_tokens is a judge error; the tokens it burnt still count.
    with endpoint(lambda messages: None, max_tokens=64) as (chat, server):
        verdict = WebTailBenchJudge(chat).judge(attempt)
    assert verdict.outcome == "error" and "cut at max_tokens=64" in verdict.reason
    assert verdict.calls == 1 and (verdict.prompt_tokens, verdict.completion_tokens) == server.usages[0]
    assert verdict.completion_tokens == 64


def test_webjudge_error_midway_keeps_the_tokens_spent(mind2web_tasks):
    task = next(iter(mind2web_tasks.values()))
    attempt = make_attempt(task, n_steps=2, answer="done")
    with endpoint(scripted_judge(lambda i: 4, final="Thoughts: unclear.").reply) as (chat, server):
        verdict = WebJudge(chat).judge(attempt)
    assert verdict.outcome == "error" and verdict.calls == len(server.usages) == 1 + 3 + 1
    assert (verdict.prompt_tokens, verdict.completion_tokens) == _sums(server)


def test_plain_text_chat_counts_calls_but_no_tokens(webvoyager_tasks):
    verdict = WebVoyagerJudge(ScriptedChat("SUCCESS")).judge(make_attempt(webvoyager_tasks["Coursera--4"], 2, "A"))
    assert verdict.outcome == "success"
    assert (verdict.calls, verdict.prompt_tokens, verdict.completion_tokens) == (1, 0, 0)


class _Reply:
    def __init__(self, text, prompt_tokens, completion_tokens):
        self.text, self.prompt_tokens, self.completion_tokens = text, prompt_tokens, completion_tokens


def test_chat_session_sums_reply_objects_and_refuses_bad_counts():
    replies = iter([_Reply("a", 10, 2), "b", _Reply("c", 5, 1)])
    session = ChatSession(lambda messages: next(replies))
    assert [session.ask([], "q") for _ in range(3)] == ["a", "b", "c"]
    assert (session.calls, session.prompt_tokens, session.completion_tokens) == (3, 15, 3)
    for bad in (_Reply("x", -1, 0), _Reply("x", 1, None), _Reply(None, 1, 1), _Reply("x", True, 1), 42):
        with pytest.raises(JudgeFailure, match=r"expected the reply text \(str\) or an object with \.text"):
            ChatSession(lambda messages, bad=bad: bad).ask([], "q")


def test_old_verdicts_read_as_zero_tokens():
    old = {"outcome": "failure", "reason": "r", "score": None, "raw": "", "judge": "webvoyager", "calls": 1}
    verdict = Verdict.from_dict(old)
    assert (verdict.calls, verdict.prompt_tokens, verdict.completion_tokens) == (1, 0, 0)
