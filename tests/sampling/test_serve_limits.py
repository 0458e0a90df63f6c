"""The ChatServer's limits, over real HTTP: input of any size or shape gets a JSON 4xx, a burst is
answered without resets, and a request that will be refused costs neither memory nor the batch
thread's time."""
import base64
import http.client
import io
import json
import os
import re
import socket
import struct
import subprocess
import sys
import threading
import time
import types
import zlib

import psutil
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from rmsweb_jax.sampling.serve import ChatServer
from tests.sampling.server_http import post_chat, request
from tests.sampling.tiny_chat import tiny_checkpoint_dir
from tests.settings import serve_settings

KEY = "limits-key"
MiB = 1 << 20


@pytest.fixture(scope="module")
def server(model):
    # The server's own default limits (body, image pixels, prompt bytes, pending requests).
    with ChatServer(model, serve_settings(api_key=KEY, max_tokens_limit=16)) as server:
        yield server


def text_body(chat_model, text="Click the button.", **overrides) -> dict:
    return {"model": chat_model.name, "max_tokens": 2, "messages": [{"role": "user", "content": text}], **overrides}


def png(width: int, height: int) -> bytes:
    buf = io.BytesIO()
    Image.new("L", (width, height), 128).save(buf, format="PNG")
    return buf.getvalue()


def bomb_png(width: int, height: int) -> bytes:
    """Returns a tiny PNG whose header claims width x height 1-bit pixels (a few rows of data)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    rows = zlib.compress(b"\0" * ((width + 7) // 8 + 1) * 4)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0))
            + chunk(b"IDAT", rows) + chunk(b"IEND", b""))


def image_body(chat_model, data: bytes) -> dict:
    url = "data:image/png;base64," + base64.b64encode(data).decode()
    return text_body(chat_model, text=[{"type": "text", "text": "What is this?"},
                                       {"type": "image_url", "image_url": {"url": url}}])


def post(server, body, key=KEY):
    return post_chat(server, body if isinstance(body, bytes) else json.dumps(body).encode(), key=key)


def assert_refused(server, body, status: int, *, code: str | None = None, param: str | None = None):
    before = server.stats()
    got, reply = post(server, body)
    assert got == status, reply
    assert set(reply["error"]) == {"message", "type", "param", "code"}, reply
    if code is not None:
        assert reply["error"]["code"] == code, reply
    if param is not None:
        assert reply["error"]["param"] == param, reply
    assert server.stats()["complete_calls"] == before["complete_calls"], "refused only after generation"
    return reply


# --- integers, nesting and methods --------------------------------------------------------------
@pytest.mark.parametrize("overrides, param", [
    ({"seed": 2 ** 63}, "seed"), ({"seed": 2 ** 64 + 5}, "seed"), ({"seed": -(2 ** 63) - 1}, "seed"),
    ({"top_k": 2 ** 63}, "top_k"), ({"top_k": 10 ** 400}, "top_k"), ({"temperature": 10 ** 400}, "temperature"),
    ({"top_p": -(10 ** 400)}, "top_p"), ({"max_tokens": 10 ** 400}, "max_tokens"), ({"n": 10 ** 400}, "n"),
])
def test_integers_out_of_range_get_a_json_400(server, model, overrides, param):
    assert_refused(server, text_body(model, **overrides), 400, param=param)


@pytest.mark.parametrize("seed", [2 ** 63 - 1, -(2 ** 63), 2 ** 32, 0])
def test_every_int64_seed_is_served_and_repeatable(server, model, seed):
    body = text_body(model, seed=seed, temperature=1.0)
    first, second = post(server, body), post(server, body)
    assert first[0] == 200, first
    assert first[1]["choices"] == second[1]["choices"]


DEPTH = 900  # below the recursion limit: json.loads accepts it, the fields must refuse it


@pytest.mark.parametrize("make, param", [
    (lambda m: b"[" * 200_000, None),
    (lambda m: b'{"model": "x", "messages": ' + b"[" * 200_000, None),
    (lambda m: b'{"a":' * 100_000, None),
    (lambda m: json.dumps(text_body(m)).encode()[:-1] + b', "stop": ' + b"[" * DEPTH + b"]" * DEPTH + b"}", "stop"),
    (lambda m: json.dumps({"model": m.name, "messages": [[]]}).encode().replace(b"[[]]", b"[" * DEPTH + b"]" * DEPTH),
     "messages[0]"),
    (lambda m: json.dumps(text_body(m)).encode().replace(b'"Click the button."', b"[" * DEPTH + b"]" * DEPTH),
     "messages[0].content[0]"),
])
def test_deeply_nested_json_gets_a_json_400(server, model, make, param):
    reply = assert_refused(server, make(model), 400, param=param)
    if param is None:
        assert reply["error"]["code"] == "invalid_json"


@pytest.mark.parametrize("method", ["PUT", "DELETE", "PATCH", "OPTIONS", "BREW"])
def test_other_methods_get_a_json_405(server, model, method):
    status, reply = request(server, method, "/v1/chat/completions", json.dumps(text_body(model)).encode())
    assert status == 405 and reply["error"]["code"] == "method_not_allowed", reply
    assert request(server, "GET", "/health", key=None)[0] == 200


@pytest.mark.parametrize("raw", [b"GARBAGE\r\n\r\n", b"GET /health HTTP/9.9\r\n\r\n", b"GET /" + b"a" * 70_000 + b"\r\n"])
def test_malformed_requests_get_a_json_4xx(server, raw):
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(raw)
        response = http.client.HTTPResponse(sock)
        response.begin()
        assert 400 <= response.status < 500 and response.getheader("Content-Type") == "application/json"
        assert set(json.loads(response.read())["error"]) == {"message", "type", "param", "code"}


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(10 ** 30), 10 ** 30) | st.sampled_from([2 ** 63, -(2 ** 64), 10 ** 400])
    | st.floats(allow_nan=False) | st.text(max_size=8) | st.sampled_from(["\ud800", "user", "image_url", "text"]),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(
        st.sampled_from(["role", "content", "type", "text", "image_url", "url"]) | st.text(max_size=4), children,
        max_size=3),
    max_leaves=8)
FIELDS = ["messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k", "seed", "stop", "n",
          "stream_options", "logprobs", "top_logprobs", "tools", "tool_choice", "model"]


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                   HealthCheck.too_slow])
@given(st.dictionaries(st.sampled_from(FIELDS), st.sampled_from([2 ** 63, -(2 ** 64), 10 ** 400, "\ud800"]) | json_values,
                       min_size=1, max_size=3))
def test_no_body_gets_a_5xx(server, model, overrides):
    body = {**text_body(model), **overrides}
    status, reply = post(server, json.dumps(body).encode())
    assert status == 200 or 400 <= status < 500, reply


# --- bursts -------------------------------------------------------------------------------------
@pytest.mark.slow  # 6 s alone, ~35 s on a 2-core machine shared with other test runs
def test_a_burst_of_200_requests_is_answered_without_resets(model):
    n = 200
    with ChatServer(model, serve_settings(max_tokens_limit=4)) as server:
        body = json.dumps(text_body(model)).encode()
        assert post(server, body, key=None)[0] == 200  # compiled before the burst
        barrier, results = threading.Barrier(n), [None] * n

        def call(i):
            conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=300)
            try:
                barrier.wait(timeout=120)
                conn.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
                response = conn.getresponse()
                results[i] = (response.status, response.getheader("Content-Type"), response.read())
            except Exception as e:  # noqa: BLE001 — a reset or timeout is what the test counts
                results[i] = e
            finally:
                conn.close()

        threads = [threading.Thread(target=call, args=(i,)) for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=600)
    failures = [r for r in results if not isinstance(r, tuple)]
    assert not failures, f"{len(failures)} of {n} requests got no HTTP response, e.g. {failures[:3]}"
    statuses = [status for status, _, _ in results]
    assert set(statuses) <= {200, 429, 503}, sorted(set(statuses))
    assert statuses.count(200) >= 8, statuses  # at least a full batch served
    for status, content_type, data in results:
        assert content_type == "application/json"
        reply = json.loads(data)
        assert ("choices" in reply) if status == 200 else set(reply["error"]) == {"message", "type", "param", "code"}


# --- images and long prompts --------------------------------------------------------------------
@pytest.mark.parametrize("data", [png(1600, 1600), png(4000, 4000), bomb_png(100_000, 100_000),
                                  bomb_png(20_000, 20_000)], ids=["1600x1600", "4000x4000", "bomb-1e10", "bomb-4e8"])
def test_an_image_over_the_pixel_limit_is_refused_from_its_header(server, model, data):
    reply = assert_refused(server, image_body(model, data), 400, code="image_too_large",
                           param="messages[0].content[1].image_url.url")
    assert "pixels" in reply["error"]["message"]


@pytest.mark.parametrize("text", ["x" * (10 * MiB), "hello world " * 4200], ids=["10MB", "over-the-token-limit"])
def test_a_prompt_too_long_is_refused_before_it_reaches_the_model(server, model, text):
    reply = assert_refused(server, text_body(model, text=text), 400, code="prompt_too_long")
    assert "messages" in reply["error"]["message"]


def test_a_small_request_does_not_wait_behind_a_prompt_being_refused(server, model):
    small = text_body(model)
    t0 = time.monotonic()
    assert post(server, small)[0] == 200
    warm = time.monotonic() - t0
    big_reply, big_done = [], threading.Event()

    def send_big():  # ~20 MB: tokenizing it would hold the batch thread for many seconds
        big_reply.append(post(server, text_body(model, text="hello world " * 1_700_000)))
        big_done.set()

    before = server.stats()
    sender = threading.Thread(target=send_big)
    sender.start()
    big_done.wait(timeout=2.0)  # refused by then, or (on a server that tokenizes it) busy with it
    t0 = time.monotonic()
    status, reply = post(server, small)
    waited = time.monotonic() - t0
    sender.join(timeout=600)
    assert status == 200, reply
    assert big_reply and big_reply[0][0] == 400 and big_reply[0][1]["error"]["code"] == "prompt_too_long", big_reply
    assert server.stats()["complete_calls"] == before["complete_calls"] + 1  # the small request's only
    assert waited < max(5.0, 5 * warm), (waited, warm)


# --- memory -------------------------------------------------------------------------------------
@pytest.mark.slow
def test_refused_requests_leave_the_server_memory_where_it_was(tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "rmsweb_jax.sampling.serve", f"--checkpoint=hf:{tiny_checkpoint_dir()}",
                             "--port=0", f"--workdir={tmp_path}"], stdout=subprocess.PIPE,
                            stderr=open(tmp_path / "serve.log", "w"), text=True,
                            env={**os.environ, "JAX_PLATFORMS": "cpu"})
    try:
        lines = []
        reader = threading.Thread(target=lambda: lines.append(proc.stdout.readline()), daemon=True)
        reader.start()
        reader.join(timeout=300)
        match = re.match(r"serving (\S+) at http://127\.0\.0\.1:(\d+)/v1 ", lines[0] if lines else "")
        assert match, (lines, (tmp_path / "serve.log").read_text()[-3000:])
        name, port = match.group(1), int(match.group(2))

        remote, m = types.SimpleNamespace(port=port), types.SimpleNamespace(name=name)

        def send(body):
            return post_chat(remote, body if isinstance(body, bytes) else json.dumps(body).encode(), key=None)

        ok = image_body(m, png(64, 48))
        assert send(ok)[0] == 200
        rss = psutil.Process(proc.pid).memory_info().rss
        refused = [text_body(m, text="x" * (10 * MiB)), text_body(m, text="hello world " * 800_000),
                   image_body(m, png(1600, 1600)), image_body(m, png(4000, 4000)),
                   image_body(m, bomb_png(100_000, 100_000)), b"[" * 200_000, text_body(m, seed=2 ** 64)]
        statuses = [send(body)[0] for _ in range(5) for body in refused]  # a ratchet shows as growth per round
        grown = psutil.Process(proc.pid).memory_info().rss - rss
        print(f"server RSS {rss / MiB:.0f} MiB, {grown / MiB:+.0f} MiB after {len(statuses)} refused requests")
        assert grown < 200 * MiB, f"RSS grew {grown / MiB:.0f} MiB over {len(statuses)} refused requests"
        assert all(400 <= s < 500 for s in statuses), statuses
        assert send(ok)[0] == 200
    finally:
        proc.kill()
        proc.wait()
