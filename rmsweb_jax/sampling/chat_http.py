"""The HTTP side of the ChatServer: the listening socket and the request handler.

Every reply is JSON, errors included: a bad request line, an unknown method or a malformed body
gets an OpenAI-style error with a 4xx (http.server's own error pages are HTML and answer an
unknown method with a 5xx). The listen backlog is sized for bursts: socketserver's default of 5
resets most connections of a few hundred clients that connect at once.

A streamed reply ("stream": true) is server-sent events: `data: <chunk JSON>` blocks, then `data: [DONE]`,
on a connection closed after it (no Content-Length to send). A refusal before the first byte is still an
ordinary JSON error. GET /metrics (no API key, like /health) is Prometheus' text format.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import hmac
import http.server
import json
import time
import urllib.parse
import uuid
from typing import Any

from absl import logging

from rmsweb_jax.sampling.chat_request import IGNORED_HEADER, RequestError
from rmsweb_jax.sampling.serve_metrics import PROMETHEUS_CONTENT_TYPE

MiB = 1 << 20
# Bodies up to this size are read and dropped after a refusal (401, 404, 413, 429), so the client
# sees the reply instead of a reset connection; anything larger just gets the connection closed.
DRAIN_LIMIT = 64 * MiB
LISTEN_BACKLOG = 1024  # the kernel caps it at net.core.somaxconn (4096 on current Linux)
ALLOWED_METHODS = "GET, POST"
COMPLETION_PATHS = ("/v1/chat/completions", "/chat/completions")
TOKEN_PATHS = ("/tokenize", "/detokenize")  # vLLM's
ROUTES = "GET /health, /metrics, /version, /v1/models, /v1/models/{id}; POST /v1/chat/completions, /tokenize, /detokenize"
# After a body this large, freed memory is handed back to the OS (see return_freed_memory).
TRIM_AFTER_BYTES = MiB


def _version() -> str:
    from importlib import metadata
    try:
        return metadata.version("rmsweb_jax")
    except metadata.PackageNotFoundError:  # run from a checkout without `pip install -e .`
        return "unknown"


def _malloc_trim():
    libc = ctypes.util.find_library("c")
    trim = getattr(ctypes.CDLL(libc), "malloc_trim", None) if libc else None
    return trim


_MALLOC_TRIM = _malloc_trim()


def return_freed_memory() -> None:
    """Hands memory freed by a large request back to the OS (glibc's malloc_trim; elsewhere nothing).

    glibc keeps freed blocks of a few MB in its per-thread arenas (after the first such block, its
    dynamic mmap threshold rises past them), and each request runs on a new thread: measured on the
    tiny server, every refused 10 MB prompt left ~28 MB more resident, without end.
    """
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)


class ChatHTTPServer(http.server.ThreadingHTTPServer):
    """A threading HTTP server whose handlers reach `app` (the ChatServer) as `self.server.app`."""

    request_queue_size = LISTEN_BACKLOG
    daemon_threads = True

    def __init__(self, address: tuple[str, int], app):
        super().__init__(address, ChatHandler)
        self.app = app


class ChatHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "rmsweb-serve/0.1"
    timeout = 60  # a client that stops sending mid-request frees its thread after this

    def log_message(self, format, *args):  # noqa: A002 — signature fixed by the base class
        logging.debug("%s %s", self.address_string(), format % args)

    @property
    def app(self):
        return self.server.app  # type: ignore[attr-defined]

    def do_GET(self):  # noqa: N802 — http.server's naming
        path = self.path.split("?", 1)[0].rstrip("/")
        try:
            if path == "/health":
                self._reply(200, {"status": "ok", "model": self.app.model_name})
            elif path == "/metrics":
                self._send(200, self.app.metrics.text(), PROMETHEUS_CONTENT_TYPE)
            elif path == "/version":
                self._reply(200, {"version": _version()})
            elif path in ("/v1/models", "/models"):
                self._authorize()
                self._reply(200, self.app.models())
            elif path.startswith(("/v1/models/", "/models/")):
                self._authorize()
                self._reply(200, self.app.model(urllib.parse.unquote(path.split("/models/", 1)[1])))
            else:
                raise RequestError(404, f"no route GET {path}; the routes: {ROUTES}", code="not_found")
        except RequestError as e:
            self._error(e)

    def do_POST(self):  # noqa: N802
        path = self.path.split("?", 1)[0].rstrip("/")
        admitted, self._body_length = False, 0
        reply_id, status, answer, started = f"chatcmpl-{uuid.uuid4().hex}", 500, None, time.monotonic()
        refused = None
        try:
            if path in TOKEN_PATHS:
                self._authorize()
                body = self._read_json()
                self._reply(200, self.app.tokenize(body) if path == "/tokenize" else self.app.detokenize(body))
                return
            if path not in COMPLETION_PATHS:
                self._drain()
                raise RequestError(404, f"no route POST {path}; the routes: {ROUTES}", code="not_found")
            try:
                self._authorize()
                admitted = self.app.admit()  # before the body is read: it bounds memory too
                if not admitted:
                    raise RequestError(429, f"the server is busy: {self.app.max_pending} requests are in progress "
                                       "(--max_pending); retry in a moment", code="server_busy", type_="server_error")
            except RequestError:
                self._drain()
                raise
            body = self._read_json()
            started = time.monotonic()  # latency: from the body read (a slow upload is the client's time)
            answer = self.app.answer(body, reply_id)
            status = 200
            headers = {IGNORED_HEADER: ", ".join(answer.request.ignored)} if answer.request.ignored else {}
            if answer.request.stream:
                self._stream(self.app.reply_chunks(answer), headers)
            else:
                self._reply(200, self.app.reply_object(answer), headers)
        except RequestError as e:
            status, refused = e.status, e
            self._error(e)
        except Exception as e:  # noqa: BLE001 — a bug here must not take the server down
            logging.exception("unexpected error serving %s", path)
            self._error(RequestError(500, f"internal error: {type(e).__name__}: {e}", code="internal_error",
                                     type_="server_error"))
        finally:
            if path in COMPLETION_PATHS:
                self.app.log_request(reply_id, status, answer, time.monotonic() - started, refused)
            if admitted:
                self.app.release()
            if self._body_length > TRIM_AFTER_BYTES:
                return_freed_memory()

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """Replies to what http.server refuses itself (bad request line, unknown method) in JSON."""
        self.close_connection = True  # the rest of the stream cannot be trusted
        if self.request_version == "HTTP/0.9":  # http.server's guess for an unparsable line: reply with a status
            self.request_version = "HTTP/1.1"
        if code == 501:  # any method without a do_* handler: the method is the client's error
            command = (self.command or "")[:20]
            error = RequestError(405, f"method {command!r} is not allowed; use {ALLOWED_METHODS}",
                                 code="method_not_allowed")
        else:
            error = RequestError(code if 400 <= code < 500 else 400, message or "bad request", code="bad_request")
        headers = {"Allow": ALLOWED_METHODS} if error.status == 405 else {}
        self._error(error, headers)

    def _authorize(self) -> None:
        key = self.app.api_key
        if key is None:
            return
        header = self.headers.get("Authorization", "")
        given = header[7:].strip() if header[:7].lower() == "bearer " else ""
        if not given:
            raise RequestError(401, "missing API key: send 'Authorization: Bearer <key>'", code="invalid_api_key")
        if not hmac.compare_digest(given.encode(), key.encode()):
            raise RequestError(401, "incorrect API key", code="invalid_api_key")

    def _content_length(self) -> int:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            self.close_connection = True
            raise RequestError(411, "chunked bodies are not supported: send a Content-Length", code="length_required")
        raw = self.headers.get("Content-Length")
        if raw is None:
            raise RequestError(411, "missing Content-Length header", code="length_required")
        try:
            n = int(raw)
            if n < 0:
                raise ValueError
        except ValueError:
            self.close_connection = True
            raise RequestError(400, f"Content-Length: expected a non-negative integer, got {raw[:40]!r}",
                               code="invalid_header") from None
        self._body_length = n
        return n

    def _drain(self) -> None:
        """Reads and drops the body so the connection stays in step (or closes it if huge)."""
        try:
            n = self._content_length()
        except RequestError:
            return
        if n > DRAIN_LIMIT:
            self.close_connection = True
            return
        while n > 0:
            chunk = self.rfile.read(min(n, MiB))
            if not chunk:
                self.close_connection = True
                return
            n -= len(chunk)

    def _read_json(self) -> Any:
        n = self._content_length()
        if n > self.app.max_body_bytes:
            self._drain()
            raise RequestError(413, f"request body of {n} bytes exceeds the limit of {self.app.max_body_bytes} bytes",
                               code="request_too_large")
        data = self.rfile.read(n)
        if len(data) != n:
            self.close_connection = True
            raise RequestError(400, f"body ended after {len(data)} of {n} bytes (Content-Length)", code="incomplete_body")
        try:
            return json.loads(data)
        except RecursionError:
            raise RequestError(400, "request body is not valid JSON: nested too deeply", code="invalid_json") from None
        except (UnicodeDecodeError, ValueError) as e:
            raise RequestError(400, f"request body is not valid JSON: {e}", code="invalid_json") from None

    def _error(self, e: RequestError, headers: dict[str, str] | None = None) -> None:
        self.app._count(client_errors=int(e.status < 500), server_errors=int(e.status >= 500))
        headers = dict(headers or {})
        if e.status == 401:
            headers["WWW-Authenticate"] = "Bearer"
        if e.status == 429:
            headers["Retry-After"] = "1"
        self._reply(e.status, e.to_dict(), headers)

    def _stream(self, chunks: list[dict[str, Any]], headers: dict[str, str] | None = None) -> None:
        """Writes `chunks` as server-sent events, then `data: [DONE]`, and closes the connection."""
        self.app._count(requests=1)
        self.close_connection = True
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        try:
            for chunk in chunks:
                data = json.dumps(chunk, ensure_ascii=False).encode("utf-8", "backslashreplace")
                self.wfile.write(b"data: " + data + b"\n\n")
                self.wfile.flush()
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()
        except OSError as err:  # the client left mid-stream: nothing more can be written to it
            logging.info("stream to %s ended early: %s", self.address_string(), err)

    def _reply(self, status: int, payload: dict[str, Any], headers: dict[str, str] | None = None) -> None:
        self.app._count(requests=1)
        data = json.dumps(payload, ensure_ascii=False).encode("utf-8", "backslashreplace")
        self._send(status, data, "application/json", headers)

    def _send(self, status: int, data: bytes, content_type: str, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)
