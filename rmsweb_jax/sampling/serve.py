"""ChatServer: an OpenAI-compatible chat-completions endpoint over a ChatModel, on 127.0.0.1.

    python -m rmsweb_jax.sampling.serve --checkpoint=hf:/ckpt/Qwen3-VL-8B-Instruct --port=8000 --api_key=KEY

Endpoints: GET /health, GET /v1/models, POST /v1/chat/completions (non-streaming). Requests
that arrive together (within `batch_window_s`, up to `max_batch`) share one `complete()` call,
so many browser workers share one generation. Every bad request gets an OpenAI-style JSON
error ({"error": {"message", "type", "param", "code"}}) with a 4xx and the server keeps serving.
A conversation the model rejects (ValueError: too long, undecodable) gets a 400 without failing
the rest of its batch; any other generation failure gets a 500, and the server keeps serving.

What a request may cost is bounded before it queues, on its own thread: at most `max_pending`
requests are in progress (more get a 429), images are checked against `max_image_pixels` from
their headers, text against `max_prompt_bytes` before tokenizing, and the prompt's token count
against the model's largest length bucket (`PromptBudget`). So the batch thread only ever sees
requests the model will take, and a refused request never holds up the ones behind it.
"""
from __future__ import annotations

import dataclasses
import queue
import signal
import threading
import time
import uuid
from typing import Any

from absl import logging

from rmsweb_jax.sampling.chat_http import MiB, ChatHTTPServer
from rmsweb_jax.sampling.chat_request import (DEFAULT_MAX_IMAGE_PIXELS, DEFAULT_MAX_PROMPT_BYTES, ChatRequest,
                                              RequestError, parse_chat_request)
from rmsweb_jax.sampling.prompt_budget import PromptBudget
from rmsweb_jax.sampling.sampler import SamplingParams

DEFAULT_MAX_PENDING = 64  # requests in progress at once (bodies being read, queued, generating)


@dataclasses.dataclass
class _Job:
    """One accepted request waiting for its share of a generation."""

    request: ChatRequest
    done: threading.Event = dataclasses.field(default_factory=threading.Event)
    completion: Any = None
    error: BaseException | None = None


class ChatServer:
    """Serves `chat_model` (a ChatModel: `.name`, `.complete(conversations, params, seed=)`, and
    `.tokenizer`, `.image_config`, `.max_prompt_tokens` for counting prompts up front).

        with ChatServer(model, api_key="k") as server:
            client = ChatClient(server.base_url, model.name, api_key="k")

    `base_url` is the OpenAI-style base (http://127.0.0.1:<port>/v1). `stats()` counts requests,
    errors and `complete_calls` (generations run), which is below `completions` when batching works.
    """

    def __init__(self, chat_model, *, host: str = "127.0.0.1", port: int = 0, api_key: str | None = None,
                 max_body_bytes: int = 32 * MiB, max_tokens_limit: int = 4096, default_max_tokens: int = 512,
                 max_batch: int = 8, batch_window_s: float = 0.01, request_timeout_s: float = 600.0,
                 max_image_pixels: int = DEFAULT_MAX_IMAGE_PIXELS, max_prompt_bytes: int = DEFAULT_MAX_PROMPT_BYTES,
                 max_pending: int = DEFAULT_MAX_PENDING):
        for name, value in (("max_body_bytes", max_body_bytes), ("max_tokens_limit", max_tokens_limit),
                            ("max_batch", max_batch), ("max_image_pixels", max_image_pixels),
                            ("max_prompt_bytes", max_prompt_bytes), ("max_pending", max_pending)):
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value!r}")
        if batch_window_s < 0:
            raise ValueError(f"batch_window_s must be >= 0, got {batch_window_s!r}")
        self.chat_model = chat_model
        self.model_name = str(chat_model.name)
        self.host, self._port = host, port
        self.api_key = api_key or None
        self.max_body_bytes = int(max_body_bytes)
        self.max_tokens_limit = int(max_tokens_limit)
        self.default_max_tokens = min(int(default_max_tokens), self.max_tokens_limit)
        self.max_batch = int(max_batch)
        self.batch_window_s = float(batch_window_s)
        self.request_timeout_s = float(request_timeout_s)
        self.max_image_pixels, self.max_prompt_bytes = int(max_image_pixels), int(max_prompt_bytes)
        self.max_pending = int(max_pending)
        self._pending = threading.BoundedSemaphore(self.max_pending)
        self._budget = PromptBudget(chat_model)
        self.created = int(time.time())
        self._jobs: queue.Queue = queue.Queue()
        self._lock = threading.Lock()
        self._seed = 0
        self._stats = {"requests": 0, "completions": 0, "complete_calls": 0, "max_batch_seen": 0, "client_errors": 0,
                       "server_errors": 0, "prompt_tokens": 0, "completion_tokens": 0}
        self._httpd: ChatHTTPServer | None = None
        self._threads: list[threading.Thread] = []

    # --- lifecycle ------------------------------------------------------------------------------
    def start(self) -> "ChatServer":
        """Binds the port and starts the HTTP and batching threads (idempotent)."""
        if self._httpd is not None:
            return self
        httpd = ChatHTTPServer((self.host, self._port), self)
        self._httpd = httpd
        self._port = httpd.server_address[1]
        self._threads = [threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.2},
                                          name=f"chat-http-{self._port}", daemon=True),
                         threading.Thread(target=self._batch_loop, name=f"chat-batch-{self._port}", daemon=True)]
        for t in self._threads:
            t.start()
        logging.info("serving %s at %s", self.model_name, self.base_url)
        if self.api_key is None and self.host not in ("127.0.0.1", "localhost", "::1"):
            logging.warning("serving on %s without an API key: anyone who can reach it can use the model", self.host)
        return self

    def close(self) -> None:
        """Stops serving; requests still waiting get a 503 (idempotent)."""
        httpd, self._httpd = self._httpd, None
        if httpd is None:
            return
        httpd.shutdown()
        httpd.server_close()
        self._jobs.put(None)
        for t in self._threads:
            t.join(timeout=10)
        while True:  # anything queued after the batcher stopped
            try:
                job = self._jobs.get_nowait()
            except queue.Empty:
                break
            if job is not None:
                job.error = RequestError(503, "the server is shutting down", code="server_shutting_down")
                job.done.set()
        self._jobs.put(None)  # a batcher still generating (past the join timeout) stops when done

    def __enter__(self) -> "ChatServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def port(self) -> int:
        """Returns the bound port (after start())."""
        return self._port

    @property
    def url(self) -> str:
        """Returns "http://<host>:<port>"."""
        return f"http://{self.host}:{self._port}"

    @property
    def base_url(self) -> str:
        """Returns the OpenAI-style base URL, "http://<host>:<port>/v1"."""
        return f"{self.url}/v1"

    @property
    def complete_calls(self) -> int:
        """Returns how many chat_model.complete() calls ran."""
        return self.stats()["complete_calls"]

    def stats(self) -> dict[str, int]:
        """Returns counts: requests (HTTP requests), completions (successful chat completions),
        complete_calls, max_batch_seen, client_errors (4xx), server_errors (5xx), token totals."""
        with self._lock:
            return dict(self._stats)

    def _count(self, **deltas: int) -> None:
        with self._lock:
            for key, value in deltas.items():
                self._stats[key] += value

    def admit(self) -> bool:
        """Returns whether one more request may start (fewer than max_pending in progress); pair with release()."""
        return self._pending.acquire(blocking=False)

    def release(self) -> None:
        """Ends a request admitted by admit()."""
        self._pending.release()

    # --- one chat completion --------------------------------------------------------------------
    def chat_completion(self, body: Any) -> dict[str, Any]:
        """Returns the OpenAI chat.completion object for a parsed JSON `body`; raises RequestError."""
        request = parse_chat_request(body, model_name=self.model_name, max_tokens_limit=self.max_tokens_limit,
                                     default_max_tokens=self.default_max_tokens, max_image_pixels=self.max_image_pixels,
                                     max_prompt_bytes=self.max_prompt_bytes)
        self._budget.check(request)  # here, not on the batch thread
        if self._httpd is None:
            raise RequestError(503, "the server is shutting down", code="server_shutting_down")
        job = _Job(request)
        self._jobs.put(job)
        if not job.done.wait(self.request_timeout_s):
            raise RequestError(504, f"generation did not finish within {self.request_timeout_s:g} s",
                               code="timeout", type_="server_error")
        if job.error is not None:
            if isinstance(job.error, RequestError):
                raise job.error
            if isinstance(job.error, ValueError):  # the model rejected this input (e.g. too long)
                raise RequestError(400, f"the model rejected the request: {job.error}", code="invalid_prompt")
            raise RequestError(500, f"generation failed: {type(job.error).__name__}: {job.error}",
                               code="generation_error", type_="server_error")
        c = job.completion
        text, finish = _apply_stop(c.text, c.finish_reason, request.stop)
        self._count(completions=1, prompt_tokens=c.prompt_tokens, completion_tokens=c.completion_tokens)
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
            "model": self.model_name,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish}],
            "usage": {"prompt_tokens": c.prompt_tokens, "completion_tokens": c.completion_tokens,
                      "total_tokens": c.prompt_tokens + c.completion_tokens},
        }

    def models(self) -> dict[str, Any]:
        """Returns the OpenAI model list (this server's one model)."""
        return {"object": "list", "data": [{"id": self.model_name, "object": "model", "created": self.created,
                                            "owned_by": "rmsweb_jax"}]}

    # --- batching -------------------------------------------------------------------------------
    def _batch_loop(self) -> None:
        # One generation at a time: while it runs, new requests queue up and form the next batch.
        stopping = False
        while not stopping:
            job = self._jobs.get()
            if job is None:
                return
            batch = [job]
            deadline = time.monotonic() + self.batch_window_s
            while len(batch) < self.max_batch:
                try:
                    nxt = self._jobs.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    break
                if nxt is None:
                    stopping = True
                    break
                batch.append(nxt)
            groups: dict[tuple, list[_Job]] = {}
            for j in batch:  # one complete() call takes one SamplingParams and one seed
                groups.setdefault((j.request.params, j.request.seed), []).append(j)
            for (params, seed), jobs in groups.items():
                self._generate(jobs, params, seed)

    def _generate(self, jobs: list[_Job], params: SamplingParams, seed: int | None) -> None:
        if seed is None:
            with self._lock:
                self._seed += 1
                seed = self._seed
        try:
            with self._lock:
                self._stats["complete_calls"] += 1
                self._stats["max_batch_seen"] = max(self._stats["max_batch_seen"], len(jobs))
            completions = self.chat_model.complete([j.request.messages for j in jobs], params, seed=seed)
            if len(completions) != len(jobs):
                raise RuntimeError(f"complete() returned {len(completions)} completions for {len(jobs)} conversations")
        except Exception as e:  # noqa: BLE001 — handed to the waiting request(s)
            if len(jobs) > 1:  # find the culprit: run each alone so one bad request fails only itself
                for j in jobs:
                    self._generate([j], params, seed)
                return
            logging.warning("generation failed: %r", e)
            completions, jobs[0].error = [None], e
        for j, c in zip(jobs, completions):
            j.completion = c
            j.done.set()


def _apply_stop(text: str, finish_reason: str, stop: tuple[str, ...]) -> tuple[str, str]:
    """Returns the text cut before the first stop string (finish "stop"), else unchanged."""
    cuts = [i for i in (text.find(s) for s in stop) if i >= 0]
    return (text[:min(cuts)], "stop") if cuts else (text, finish_reason)


def main(argv) -> None:
    """Loads --checkpoint, serves it until interrupted, and prints the URL."""
    import pathlib
    import tempfile

    from absl import app
    from absl import flags as absl_flags

    from rmsweb_jax.sampling.chat_model import ChatModel
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    flags = absl_flags.FLAGS
    workdir = pathlib.Path(flags.workdir or tempfile.mkdtemp(prefix="rmsweb-serve-"))
    # The model id clients send: the checkpoint's own name (folder@hash of its weights) unless given.
    model = ChatModel.load(flags.checkpoint, workdir, **({"name": flags.served_model_name}
                                                       if flags.served_model_name else {}))
    server = ChatServer(model, host=flags.host, port=flags.port, api_key=flags.api_key or None,
                        max_body_bytes=flags.max_body_mib * MiB, max_tokens_limit=flags.max_tokens_limit,
                        max_batch=flags.max_batch, batch_window_s=flags.batch_window_s,
                        max_image_pixels=flags.max_image_pixels, max_prompt_bytes=flags.max_prompt_bytes,
                        max_pending=flags.max_pending)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())  # `kill` stops it as cleanly as Ctrl-C
    with server:
        print(f"serving {model.name} at {server.base_url} (model id {model.name!r})", flush=True)
        try:
            while not stop.wait(1.0):
                pass
        except KeyboardInterrupt:
            pass
        finally:
            model.close()
    print("server stopped", flush=True)


def define_flags() -> None:
    """Defines the CLI's absl flags (only when run as a program, so importing defines none)."""
    from absl import flags
    flags.DEFINE_string("checkpoint", None, "Model to serve: hf:/path/to/checkpoint or random:tiny.")
    flags.DEFINE_string("host", "127.0.0.1", "Address to bind (127.0.0.1 keeps it off the network).")
    flags.DEFINE_integer("port", 8000, "Port to bind (0: any free port).")
    flags.DEFINE_string("api_key", None, "If set, requests must send 'Authorization: Bearer <key>'.")
    flags.DEFINE_string("served_model_name", "", "Model id clients send in requests (\"\" = the checkpoint's "
                        "name, <folder>@<hash of its weights>, printed at start).")
    flags.DEFINE_string("workdir", None, "Where random:tiny writes its checkpoint (default: a temp dir).")
    flags.DEFINE_integer("max_batch", 8, "Most requests batched into one generation.")
    flags.DEFINE_float("batch_window_s", 0.01, "How long to wait for more requests to batch.")
    flags.DEFINE_integer("max_tokens_limit", 4096, "Largest max_tokens a request may ask for.")
    flags.DEFINE_integer("max_body_mib", 32, "Largest request body, in MiB.")
    flags.DEFINE_integer("max_image_pixels", DEFAULT_MAX_IMAGE_PIXELS,
                         "Most pixels (width x height) an image may have; larger ones are refused from their header.")
    flags.DEFINE_integer("max_prompt_bytes", DEFAULT_MAX_PROMPT_BYTES,
                         "Most UTF-8 bytes of text a request may hold; more is refused before tokenizing.")
    flags.DEFINE_integer("max_pending", DEFAULT_MAX_PENDING, "Most requests in progress; more get a 429.")
    flags.mark_flag_as_required("checkpoint")


if __name__ == "__main__":
    from absl import app as _app
    define_flags()
    _app.run(main)
