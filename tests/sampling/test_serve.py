"""The OpenAI-compatible ChatServer over a tiny random ChatModel, spoken to over real HTTP."""
import base64
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request

import pytest

from rmsweb_jax.agents.chat_client import ChatClient, ChatError
from rmsweb_jax.sampling.chat_model import ChatModel
from rmsweb_jax.sampling.serve import ChatServer
from tests.sampling.server_http import KEY, chat_body, png_url, post_chat, request
from tests.sampling.tiny_chat import tiny_checkpoint_dir
from tests.settings import serve_settings

MAX_BODY = 1 << 20


@pytest.fixture(scope="module")
def server(model):
    with ChatServer(model, serve_settings(api_key=KEY, max_body_bytes=MAX_BODY, max_tokens_limit=64)) as server:
        yield server


def test_chat_completion_is_openai_shaped(server, model):
    status, reply = post_chat(server, chat_body(model))
    assert status == 200, reply
    assert reply["object"] == "chat.completion" and reply["id"].startswith("chatcmpl-")
    assert reply["model"] == model.name and isinstance(reply["created"], int)
    [choice] = reply["choices"]
    assert choice["index"] == 0 and choice["message"]["role"] == "assistant"
    assert isinstance(choice["message"]["content"], str) and choice["finish_reason"] in ("stop", "length")
    usage = reply["usage"]
    assert 1 <= usage["completion_tokens"] <= 6
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    # The prompt count is the model's own: template + expanded image placeholders.
    assert usage["prompt_tokens"] == len(model.encode(chat_body(model)["messages"]).input_ids)
    # Greedy decoding of the same request gives the same reply.
    assert post_chat(server, chat_body(model))[1]["choices"] == reply["choices"]


def test_health_and_models(server, model):
    assert request(server, "GET", "/health", key=None) == (200, {"status": "ok", "model": model.name})
    status, models = request(server, "GET", "/v1/models")
    assert status == 200 and [m["id"] for m in models["data"]] == [model.name]
    status, reply = request(server, "GET", "/v1/models", key=None)
    assert status == 401 and reply["error"]["code"] == "invalid_api_key"
    assert ChatClient(server.base_url, model.name, api_key=KEY).list_models() == [model.name]


def _bad_requests(name):
    # (raw body or body overrides, extra request kwargs, expected status, expected param or message part)
    return {
        "bad_json": (b'{"model": "rmsweb", "messages": [', {}, 400, "not valid JSON"),
        "not_an_object": (b'[1, 2]', {}, 400, "expected a JSON object"),
        "oversized_body": (b"x" * (2 * MAX_BODY), {}, 413, "exceeds the limit"),
        "wrong_api_key": ({}, {"key": "wrong"}, 401, "incorrect API key"),
        "missing_api_key": ({}, {"key": None}, 401, "missing API key"),
        "missing_messages": ({"messages": None}, {}, 400, "messages"),
        "empty_messages": ({"messages": []}, {}, 400, "messages"),
        "bad_role": ({"messages": [{"role": "robot", "content": "hi"}]}, {}, 400, "messages[0].role"),
        "missing_model": ({"model": None}, {}, 400, "model"),
        "unknown_model": ({"model": "gpt-9"}, {}, 404, "model"),
        "n_over_limit": ({"n": 17}, {}, 400, "n"),  # the default max_n is 16
        "n_0": ({"n": 0}, {}, 400, "n"),
        "penalty": ({"frequency_penalty": 0.5}, {}, 400, "frequency_penalty"),
        "max_tokens_over_limit": ({"max_tokens": 65}, {}, 400, "max_tokens"),
        "bad_temperature": ({"temperature": "hot"}, {}, 400, "temperature"),
        "bad_image_base64": ({"messages": [{"role": "user", "content": [
            {"type": "text", "text": "hi"}, {"type": "image_url", "image_url": {"url": "data:image/png;base64,@@@"}}]}]},
            {}, 400, "messages[0].content[1].image_url.url"),
        "not_an_image": ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {
            "url": "data:image/png;base64," + base64.b64encode(b"definitely not a png").decode()}}]}]},
            {}, 400, "messages[0].content[0].image_url.url"),
        "remote_image": ({"messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}]}]},
            {}, 400, "messages[0].content[0].image_url.url"),
        "image_in_system_turn": ({"messages": [{"role": "system", "content": [
            {"type": "image_url", "image_url": {"url": png_url()}}]}, {"role": "user", "content": "hi"}]},
            {}, 400, "messages[0].content[0]"),
    }[name]


BAD = ["bad_json", "not_an_object", "oversized_body", "wrong_api_key", "missing_api_key", "missing_messages",
       "empty_messages", "bad_role", "missing_model", "unknown_model", "n_over_limit", "n_0", "penalty",
       "max_tokens_over_limit", "bad_temperature", "bad_image_base64", "not_an_image", "remote_image",
       "image_in_system_turn"]


@pytest.mark.parametrize("case", BAD)
def test_bad_request_gets_a_json_4xx_and_the_server_keeps_serving(server, model, case):
    body, kw, expected_status, where = _bad_requests(case)
    if isinstance(body, dict):
        body = {k: v for k, v in chat_body(model, **body).items() if v is not None}
    before = server.stats()
    status, reply = post_chat(server, body, **kw)
    assert status == expected_status, reply
    error = reply["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["type"] == "invalid_request_error"
    assert where in error["message"] or where == error["param"], error
    assert server.stats()["client_errors"] == before["client_errors"] + 1
    assert server.stats()["complete_calls"] == before["complete_calls"]  # refused before generation
    status, reply = post_chat(server, chat_body(model))
    assert status == 200, reply


def test_client_does_not_retry_a_4xx_from_the_server(server, model):
    client = ChatClient(server.base_url, model.name, api_key="wrong", backoff_s=0.01)
    with pytest.raises(ChatError, match="HTTP 401: incorrect API key") as err:
        client.complete([{"role": "user", "content": "hi"}], max_tokens=4)
    assert err.value.attempts == 1 and client.stats()["retries"] == 0


def test_concurrent_requests_share_one_generation(model):
    tasks = ["Click the button.", "Type hello into the box and press enter.", "Scroll down.",
             "Find the link named Contact and open it, then wait."]
    conversations = [chat_body(model, messages=[{"role": "user", "content": [
        {"type": "text", "text": t}, {"type": "image_url", "image_url": {"url": png_url()}}]}])["messages"]
        for t in tasks]
    # A generous window keeps this deterministic on a loaded machine.
    with ChatServer(model, serve_settings(max_batch=8, batch_window_s=0.5)) as server:
        client = ChatClient(server.base_url, model.name, max_concurrency=8)
        results, barrier = [None] * 4, threading.Barrier(4)

        def call(i):
            barrier.wait()
            results[i] = client.complete(conversations[i], max_tokens=6)

        threads = [threading.Thread(target=call, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        stats = server.stats()
    assert stats["completions"] == 4
    assert stats["complete_calls"] < 4 and stats["max_batch_seen"] >= 2, stats
    # Each reply went to its own request: prompt sizes differ by prompt.
    expected = [len(model.encode(c).input_ids) for c in conversations]
    assert len(set(expected)) == 4 and [r.prompt_tokens for r in results] == expected


def test_a_prompt_too_long_is_refused_before_it_joins_a_batch(model):
    # Longer than the largest length bucket: counted on its own thread and refused there, so the
    # good request sent with it generates alone (one complete() call) and never waits on it.
    too_long = [{"role": "user", "content": "hello world " * 4200}]
    good = chat_body(model)["messages"]
    with ChatServer(model, serve_settings(batch_window_s=0.5)) as server:
        client = ChatClient(server.base_url, model.name, backoff_s=0.01)
        outcome = {}

        def call(name, messages):
            try:
                outcome[name] = client.complete(messages, max_tokens=6)
            except ChatError as e:
                outcome[name] = e

        threads = [threading.Thread(target=call, args=a) for a in (("long", too_long), ("good", good))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        stats = server.stats()
    assert isinstance(outcome["long"], ChatError) and outcome["long"].status == 400
    assert "largest length bucket" in str(outcome["long"]) and "tokens" in str(outcome["long"])
    assert outcome["good"].completion_tokens >= 1
    assert stats["complete_calls"] == 1


def test_generation_failure_is_a_500_and_the_server_survives(model):
    closed = ChatModel(model.model, model.tokenizer, name=model.name, image_config=model.image_config,
                       stop_token_ids=model.stop_token_ids)
    closed.close()
    with ChatServer(closed, serve_settings()) as server:
        client = ChatClient(server.base_url, model.name, max_retries=1, backoff_s=0.01)
        for _ in range(2):
            with pytest.raises(ChatError, match=r"HTTP 500: generation failed: RuntimeError: .*is closed") as err:
                client.complete([{"role": "user", "content": "hi"}], max_tokens=4)
            assert err.value.status == 500 and err.value.attempts == 2  # 5xx is retried
        assert request(server, "GET", "/health", key=None)[0] == 200
        assert server.stats()["server_errors"] == 4


def test_stop_strings_cut_the_text(server, model):
    status, reply = post_chat(server, chat_body(model))
    text = reply["choices"][0]["message"]["content"]
    if len(text) < 2:
        pytest.skip(f"the random model wrote {text!r}: nothing to cut")
    status, cut = post_chat(server, chat_body(model, stop=[text[1:]]))
    assert status == 200 and cut["choices"][0] == {"index": 0, "message": {"role": "assistant", "content": text[:1]},
                                                   "finish_reason": "stop", "logprobs": None}


def _answered(client) -> tuple[str, str]:
    """Returns ('answered', text) or ('refused <status>', message) for one chat call, ('reset', error) when the
    connection broke."""
    try:
        return "answered", client.complete([{"role": "user", "content": "hi"}], max_tokens=256).text
    except ChatError as err:
        return (f"refused {err.status}" if getattr(err, "status", None) else "reset"), str(err)


def test_cli_prints_its_url_serves_and_stops_on_sigterm(tmp_path):
    checkpoint = tiny_checkpoint_dir()
    log = open(tmp_path / "serve.log", "w+")
    proc = subprocess.Popen([sys.executable, "-m", "rmsweb_jax.sampling.serve", f"--checkpoint=hf:{checkpoint}",
                             "--port=0", "--api_key=cli-key", f"--workdir={tmp_path}", "--served_model_name=my-agent"],
                            stdout=subprocess.PIPE, stderr=log, text=True, env={**os.environ, "JAX_PLATFORMS": "cpu"})
    try:
        lines = []
        reader = threading.Thread(target=lambda: lines.append(proc.stdout.readline()), daemon=True)
        reader.start()
        reader.join(timeout=300)  # loading the checkpoint; the URL line comes when it serves
        line = lines[0] if lines else ""
        match = re.match(r"serving (\S+) at (http://127\.0\.0\.1:\d+/v1) ", line)
        assert match, (line, log.seek(0) or log.read()[-3000:])
        name, base_url = match.groups()
        assert name == "my-agent"  # --served_model_name replaces the checkpoint's folder@hash name
        assert ChatClient(base_url, name, api_key="cli-key").list_models() == [name]
        with pytest.raises(ChatError, match="HTTP 401"):
            ChatClient(base_url, name, api_key="nope").list_models()
        # A request in flight when SIGTERM comes (its first call compiles for seconds) is answered, not reset.
        replies = []
        client = ChatClient(base_url, name, api_key="cli-key", max_retries=0)
        caller = threading.Thread(target=lambda: replies.append((*_answered(client), time.monotonic())), daemon=True)
        caller.start()
        metrics = base_url.removesuffix("/v1") + "/metrics"
        deadline = time.monotonic() + 60
        while "rmsweb_serve_requests_in_progress 1.0" not in urllib.request.urlopen(metrics).read().decode():
            assert time.monotonic() < deadline and not replies, replies  # admitted, not yet answered
            time.sleep(0.01)
        proc.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        caller.join(timeout=60)
        assert replies and replies[0][0] in ("answered", "refused 503"), replies
        assert replies[0][2] > signalled, "the reply came before the signal: nothing was in flight"
        assert proc.wait(timeout=30) == 0
        assert proc.stdout.read().strip() == "server stopped"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()
