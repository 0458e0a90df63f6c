"""ChatClient: calls any OpenAI-compatible chat-completions endpoint (ours, vLLM, SGLang, a hosted VLM).

Stdlib only (urllib). Retries with exponential backoff and jitter on 5xx, 429, timeouts and
connection errors; any other 4xx is the caller's fault and raises at once with the server's
message. A semaphore bounds the calls in flight, and every call is counted for reports.
Images travel inside the messages as data URLs, exactly as the caller built them.
"""
from __future__ import annotations

import dataclasses
import http.client
import json
import random
import socket
import threading
import time
import urllib.error
import urllib.request
from typing import Any, Mapping, Sequence

# Cap on one backoff pause (a Retry-After header may ask for more).
MAX_BACKOFF_S = 30.0
_RETRY_STATUSES = frozenset({429}) | frozenset(range(500, 600))


@dataclasses.dataclass(frozen=True)
class ChatResult:
    """One assistant turn: its text, the token counts the server reported, and why it ended."""

    text: str
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str

    def to_dict(self) -> dict[str, Any]:
        """Returns a JSON-ready dict."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "ChatResult":
        """Returns the result stored by `to_dict`."""
        return cls(text=d["text"], prompt_tokens=d["prompt_tokens"], completion_tokens=d["completion_tokens"],
                   finish_reason=d["finish_reason"])


class ChatError(RuntimeError):
    """A chat-completions call that failed for good.

    `status` is the HTTP status (None for timeouts / connection errors / malformed replies),
    `retryable` whether the failure was of a kind that is retried (then retries ran out),
    `attempts` how many HTTP requests were made.
    """

    def __init__(self, message: str, *, status: int | None = None, retryable: bool = False, attempts: int = 1):
        super().__init__(message)
        self.status, self.retryable, self.attempts = status, retryable, attempts


class ChatClient:
    """A thread-safe client for `POST {base_url}/chat/completions`.

    `base_url` is the OpenAI-style base, usually ending in /v1 (http://127.0.0.1:8000/v1).
    `max_retries` counts retries after the first attempt; backoff before retry k (from 0) is
    `backoff_s * 2**k` times a jitter factor in [1, 1.5), at most MAX_BACKOFF_S, or the server's
    Retry-After when larger.
    """

    def __init__(self, base_url: str, model: str, *, api_key: str | None = None, timeout_s: float = 60.0,
                 max_retries: int = 4, backoff_s: float = 0.5, max_concurrency: int = 8):
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must start with http:// or https://, got {base_url!r}")
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}")
        if max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {max_retries!r}")
        if backoff_s < 0:
            raise ValueError(f"backoff_s must be >= 0, got {backoff_s!r}")
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {max_concurrency!r}")
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.timeout_s = float(timeout_s)
        self.max_retries = int(max_retries)
        self.backoff_s = float(backoff_s)
        self.max_concurrency = int(max_concurrency)
        self._api_key = api_key
        self._slots = threading.BoundedSemaphore(self.max_concurrency)
        self._lock = threading.Lock()
        self._rng = random.Random()
        self._stats = {"calls": 0, "requests": 0, "retries": 0, "failures": 0, "prompt_tokens": 0,
                       "completion_tokens": 0}

    # --- public API -----------------------------------------------------------------------------
    def complete(self, messages: Sequence[Mapping[str, Any]], *, max_tokens: int, temperature: float = 0.0,
                 top_p: float = 1.0, stop: str | Sequence[str] | None = None, seed: int | None = None) -> ChatResult:
        """Returns the assistant's reply to `messages` (OpenAI chat format); raises ChatError."""
        body: dict[str, Any] = {"model": self.model, "messages": list(messages), "max_tokens": int(max_tokens),
                                "temperature": float(temperature), "top_p": float(top_p)}
        if stop is not None:
            body["stop"] = [stop] if isinstance(stop, str) else list(stop)
        if seed is not None:
            body["seed"] = int(seed)
        payload = json.dumps(body).encode("utf-8")
        self._count(calls=1)
        with self._slots:
            try:
                reply = self._post_with_retries(f"{self.base_url}/chat/completions", payload)
                result = _parse_completion(reply)
            except ChatError:
                self._count(failures=1)
                raise
        self._count(prompt_tokens=result.prompt_tokens, completion_tokens=result.completion_tokens)
        return result

    def list_models(self) -> list[str]:
        """Returns the model ids the server lists at GET {base_url}/models; raises ChatError."""
        status, data, _ = self._request(f"{self.base_url}/models", None)
        if status != 200:
            raise ChatError(f"GET {self.base_url}/models: HTTP {status}: {_server_message(data)}", status=status)
        try:
            return [m["id"] for m in json.loads(data)["data"]]
        except (ValueError, KeyError, TypeError) as e:
            raise ChatError(f"GET {self.base_url}/models: malformed reply ({e!r}): {data[:200]!r}") from None

    def stats(self) -> dict[str, int]:
        """Returns counts so far: calls (complete() invocations), requests (HTTP attempts),
        retries, failures (calls that raised), prompt_tokens, completion_tokens."""
        with self._lock:
            return dict(self._stats)

    def close(self) -> None:
        """Nothing to release (one connection per request); kept for the policy interface."""

    def __enter__(self) -> "ChatClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # --- internals ------------------------------------------------------------------------------
    def _count(self, **deltas: int) -> None:
        with self._lock:
            for key, value in deltas.items():
                self._stats[key] += value

    def _post_with_retries(self, url: str, payload: bytes) -> bytes:
        attempt = 0
        while True:
            attempt += 1
            self._count(requests=1)
            retry_after = None
            try:
                status, data, headers = self._request(url, payload)
            except (TimeoutError, socket.timeout) as e:
                problem, status = f"timed out after {self.timeout_s:g} s ({e})", None
            except (ConnectionError, http.client.HTTPException, urllib.error.URLError, OSError) as e:
                reason = getattr(e, "reason", e)
                if isinstance(reason, (TimeoutError, socket.timeout)):
                    problem = f"timed out after {self.timeout_s:g} s ({reason})"
                else:
                    problem = f"connection error: {reason!r}"
                status = None
            else:
                if status == 200:
                    return data
                problem = f"HTTP {status}: {_server_message(data)}"
                retry_after = _retry_after_s(headers.get("Retry-After"))
                if status not in _RETRY_STATUSES:
                    raise ChatError(f"POST {url}: {problem}", status=status, retryable=False, attempts=attempt)
            if attempt > self.max_retries:
                raise ChatError(f"POST {url}: {problem} (gave up after {attempt} attempts)", status=status,
                                retryable=True, attempts=attempt)
            self._count(retries=1)
            with self._lock:
                jitter = 1.0 + 0.5 * self._rng.random()
            pause = min(self.backoff_s * 2 ** (attempt - 1) * jitter, MAX_BACKOFF_S)
            time.sleep(max(pause, min(retry_after or 0.0, MAX_BACKOFF_S)))

    def _request(self, url: str, payload: bytes | None) -> tuple[int, bytes, Mapping[str, str]]:
        """Returns (status, body, headers) of one HTTP request; raises on transport errors."""
        headers = {"Accept": "application/json"}
        if payload is not None:
            headers["Content-Type"] = "application/json"
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        request = urllib.request.Request(url, data=payload, headers=headers, method="GET" if payload is None else "POST")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                return response.status, response.read(), response.headers
        except urllib.error.HTTPError as e:  # a status the server chose: hand it back, not raise
            with e:
                return e.code, e.read(), e.headers or {}


def _parse_completion(data: bytes) -> ChatResult:
    """Returns the first choice of a chat-completions reply; raises ChatError on a malformed one."""
    try:
        reply = json.loads(data)
        choice = reply["choices"][0]
        text = choice["message"].get("content") or ""
        usage = reply.get("usage") or {}
        return ChatResult(text=text, prompt_tokens=int(usage.get("prompt_tokens", 0)),
                          completion_tokens=int(usage.get("completion_tokens", 0)),
                          finish_reason=str(choice.get("finish_reason") or ""))
    except (ValueError, KeyError, IndexError, TypeError, AttributeError) as e:
        raise ChatError(f"malformed chat-completions reply ({e!r}); expected choices[0].message.content: "
                        f"{data[:300]!r}") from None


def _server_message(data: bytes) -> str:
    """Returns the error message of an OpenAI-style error body, else the body's start."""
    try:
        error = json.loads(data)["error"]
        return str(error.get("message", error)) if isinstance(error, dict) else str(error)
    except (ValueError, KeyError, TypeError):
        return data[:300].decode("utf-8", "replace") or "(empty body)"


def _retry_after_s(value: str | None) -> float | None:
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:  # an HTTP date: ignore it, the backoff applies
        return None
