"""ChatClient against small real HTTP servers on 127.0.0.1 that misbehave on purpose."""
import http.server
import json
import socket
import threading
import time

import pytest

from rmsweb_jax.agents.chat_client import ChatClient, ChatError, ChatResult


def completion_body(text: str = "ok", prompt_tokens: int = 5, completion_tokens: int = 2) -> dict:
    return {"id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": "m",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                      "total_tokens": prompt_tokens + completion_tokens}}


# Upper bound on any wait in this file: only reached when the behaviour under test is broken.
WAIT_S = 60.0


class ScriptedServer:
    """A stdlib HTTP server that answers POSTs from a script: each entry is (status, body dict or
    raw bytes, headers, gate), where gate is None (answer at once) or a threading.Event the
    answer waits for; the last entry repeats. Records every request body. Leaving the `with`
    block sets every gate, so no handler outlives the test."""

    def __init__(self, script):
        self.script, self.bodies, self.in_flight, self.max_in_flight = list(script), [], 0, 0
        self._lock = threading.Lock()
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):  # noqa: N802
                body = self.rfile.read(int(self.headers["Content-Length"]))
                with owner._lock:
                    owner.bodies.append((self.path, dict(self.headers), json.loads(body)))
                    index = len(owner.bodies) - 1
                    owner.in_flight += 1
                    owner.max_in_flight = max(owner.max_in_flight, owner.in_flight)
                status, payload, headers, gate = owner.script[min(index, len(owner.script) - 1)]
                counted = True
                try:
                    if gate is not None:
                        gate.wait(WAIT_S)
                    data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
                    # Out of flight before the answer goes: once the client has read it, it may send the next
                    # request, which must not find this one still counted (a race, not a leaked bound).
                    with owner._lock:
                        owner.in_flight -= 1
                        counted = False
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    for k, v in headers.items():
                        self.send_header(k, v)
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):  # the client gave up (timeout test)
                    pass
                finally:
                    if counted:
                        with owner._lock:
                            owner.in_flight -= 1

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.base_url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for entry in self.script:
            if entry[3] is not None:
                entry[3].set()
        self.httpd.shutdown()
        self.httpd.server_close()


def error_body(message: str) -> dict:
    return {"error": {"message": message, "type": "server_error", "param": None, "code": None}}


MESSAGES = [{"role": "user", "content": [{"type": "text", "text": "hi"},
                                         {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}]


def test_retries_5xx_then_succeeds():
    script = [(503, error_body("overloaded"), {}, None), (503, error_body("overloaded"), {}, None),
              (200, completion_body("<tool_call>x</tool_call>", 11, 3), {}, None)]
    with ScriptedServer(script) as server:
        client = ChatClient(server.base_url, "m", api_key="secret", backoff_s=0.01)
        result = client.complete(MESSAGES, max_tokens=7, temperature=0.5, stop=["</tool_call>"], seed=3)
        assert result == ChatResult("<tool_call>x</tool_call>", 11, 3, "stop")
        assert len(server.bodies) == 3
        path, headers, body = server.bodies[-1]
        assert path == "/v1/chat/completions" and headers["Authorization"] == "Bearer secret"
        # The images travel exactly as given.
        assert body == {"model": "m", "messages": MESSAGES, "max_tokens": 7, "temperature": 0.5, "top_p": 1.0,
                        "stop": ["</tool_call>"], "seed": 3}
        assert client.stats() == {"calls": 1, "requests": 3, "retries": 2, "failures": 0, "prompt_tokens": 11,
                                  "completion_tokens": 3}


def test_no_retry_on_400_and_the_server_message_is_raised():
    with ScriptedServer([(400, error_body("messages[0].role: expected one of ..."), {}, None),
                         (200, completion_body(), {}, None)]) as server:
        client = ChatClient(server.base_url, "m", backoff_s=0.01)
        with pytest.raises(ChatError, match=r"HTTP 400: messages\[0\]\.role: expected one of") as err:
            client.complete(MESSAGES, max_tokens=4)
        assert err.value.status == 400 and not err.value.retryable and err.value.attempts == 1
        assert len(server.bodies) == 1
        assert client.stats()["failures"] == 1 and client.stats()["retries"] == 0


def test_429_honours_retry_after_and_gives_up_after_max_retries():
    with ScriptedServer([(429, error_body("slow down"), {"Retry-After": "0.3"}, None)]) as server:
        client = ChatClient(server.base_url, "m", max_retries=2, backoff_s=0.001)
        start = time.monotonic()
        with pytest.raises(ChatError, match=r"HTTP 429: slow down \(gave up after 3 attempts\)") as err:
            client.complete(MESSAGES, max_tokens=4)
        assert time.monotonic() - start >= 0.6  # two pauses of Retry-After, not of the 1 ms backoff
        assert err.value.status == 429 and err.value.retryable and len(server.bodies) == 3


def test_a_timed_out_request_is_retried():
    never = threading.Event()  # the first answer waits for the end of the test
    script = [(200, completion_body("late"), {}, never), (200, completion_body("on time"), {}, None)]
    with ScriptedServer(script) as server:
        # 3 s: long enough for a local answer on a loaded machine, short enough for the test.
        client = ChatClient(server.base_url, "m", timeout_s=3.0, backoff_s=0.01)
        assert client.complete(MESSAGES, max_tokens=4).text == "on time"
        assert client.stats()["retries"] == 1 and len(server.bodies) == 2


def test_a_server_that_never_answers_raises_a_timeout_error():
    with ScriptedServer([(200, completion_body(), {}, threading.Event())]) as server:
        client = ChatClient(server.base_url, "m", timeout_s=1.0, max_retries=1, backoff_s=0.01)
        start = time.monotonic()
        with pytest.raises(ChatError, match=r"timed out after 1 s.*gave up after 2 attempts") as err:
            client.complete(MESSAGES, max_tokens=4)
        assert time.monotonic() - start < WAIT_S / 2  # the client's timeout, not the server's release
        assert err.value.status is None and err.value.retryable and err.value.attempts == 2
        assert len(server.bodies) == 2 and client.stats()["failures"] == 1


def test_refused_connections_are_retried():
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    client = ChatClient(f"http://127.0.0.1:{port}/v1", "m", max_retries=2, backoff_s=0.01)
    with pytest.raises(ChatError, match="connection error.*gave up after 3 attempts") as err:
        client.complete(MESSAGES, max_tokens=4)
    assert err.value.status is None and client.stats() == {
        "calls": 1, "requests": 3, "retries": 2, "failures": 1, "prompt_tokens": 0, "completion_tokens": 0}


def test_malformed_reply_is_an_error_not_a_retry():
    with ScriptedServer([(200, b"<html>not json</html>", {}, None)]) as server:
        client = ChatClient(server.base_url, "m", backoff_s=0.01)
        with pytest.raises(ChatError, match="malformed chat-completions reply"):
            client.complete(MESSAGES, max_tokens=4)
        assert len(server.bodies) == 1


def wait_until(condition, what: str) -> None:
    """Polls `condition()` until it holds; fails the test after WAIT_S."""
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.02)


def test_concurrency_is_bounded():
    release = threading.Event()
    with ScriptedServer([(200, completion_body(), {}, release)]) as server:
        client = ChatClient(server.base_url, "m", max_concurrency=2)
        threads = [threading.Thread(target=client.complete, args=(MESSAGES,), kwargs={"max_tokens": 1})
                   for _ in range(6)]
        for t in threads:
            t.start()
        # Every answer is held: two requests reach the server and the other four wait in the client.
        wait_until(lambda: server.in_flight >= 2, "two requests in flight")
        time.sleep(0.5)  # room for a third to arrive if the bound leaked (passing does not depend on it)
        assert server.in_flight == 2 and len(server.bodies) == 2
        release.set()
        for t in threads:
            t.join(WAIT_S)
        assert len(server.bodies) == 6 and server.max_in_flight == 2
        assert client.stats()["calls"] == 6 and client.stats()["prompt_tokens"] == 30


def test_constructor_checks_its_arguments():
    with pytest.raises(ValueError, match="base_url"):
        ChatClient("127.0.0.1:8000/v1", "m")
    with pytest.raises(ValueError, match="max_concurrency"):
        ChatClient("http://127.0.0.1:8000/v1", "m", max_concurrency=0)
