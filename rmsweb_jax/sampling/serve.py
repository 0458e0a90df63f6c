"""ChatServer: an OpenAI-compatible chat-completions endpoint over a ChatModel, on 127.0.0.1.

    python -m rmsweb_jax.sampling.serve --checkpoint=hf:/ckpt/Qwen3-VL-8B-Instruct --port=8000
        --api_key=KEY --model_name=qwen3-vl-8b --dtype=bfloat16 --mesh_shape=1,4,2

Endpoints: GET /health, /version, /v1/models, /v1/models/{id}, /metrics (Prometheus); POST /v1/chat/completions
(JSON, or server-sent events with "stream": true; log-probs, tools: `chat_reply.py`, `tool_calls.py`;
fields it does not implement are refused: `chat_request.py`), /tokenize and /detokenize (vLLM's). Requests that arrive together (within
`batch_window_s`, up to `max_batch`) share one `complete()` call, so many browser workers share one
generation. `--dtype` and `--mesh_shape` (or a run's `--config`) load the parameters in that dtype, sharded
over the mesh by the sharding rules.

The sampler compiles one program per max_new_tokens, so a request's max_tokens runs in the smallest
of a few buckets that holds it (powers of two from 16, then `max_tokens_limit`) and its choices are
cut at its own max_tokens afterwards: finish "length" with the same tokens an unbucketed run gives.
Requests whose max_tokens share a bucket also share a generation. A request with n > 1 is answered
by shared-prefix group sampling (`ChatModel.sample_groups`: the prompt prefilled once, n samples
decoded from copies of its cache).

`--warmup` runs one generation per max_tokens bucket, batch size and sampling mode (greedy, temperature,
temperature + top_p) before serving, so no client waits for those compilations; it prints how long it took.
It warms the smallest prompt-length bucket only: a prompt of another bucket (a screenshot's thousands of
tokens) compiles on first use, as do top_k and n > 1.
Each chat request writes one log line (id, status, tokens in / out, latency, why it was refused); /metrics counts
the same.

Every bad request gets an OpenAI-style JSON error ({"error": {"message", "type", "param", "code"}})
with a 4xx and the server keeps serving.
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
import functools
import pathlib
import queue
import signal
import sys
import tempfile
import threading
import time
import uuid
from typing import Any, Sequence

from absl import app, flags, logging
from ml_collections import config_flags

from rmsweb_jax.errors import UserError, run_absl_command
from rmsweb_jax.sampling.chat_http import MiB, ChatHTTPServer
from rmsweb_jax.sampling.chat_reply import ChoiceReply, TokenText, choice_reply, chunk_objects, completion_object
from rmsweb_jax.sampling.chat_request import (DEFAULT_MAX_IMAGE_PIXELS, DEFAULT_MAX_N, DEFAULT_MAX_PROMPT_BYTES,
                                              ChatRequest, RequestError, parse_chat_request)
from rmsweb_jax.sampling.params import SamplingParams
from rmsweb_jax.sampling.serve_metrics import ServeMetrics, compile_count
from rmsweb_jax.sampling.tool_calls import renders_like_template

DEFAULT_MAX_PENDING = 64  # requests in progress at once (bodies being read, queued, generating)
SMALLEST_MAX_TOKENS_BUCKET = 16  # below it a program per size saves at most 15 decode steps
DRAIN_S = 25.0  # on close, how long admitted requests may take to get their replies written (a preempted VM has ~30 s)
SERVE_DTYPES = ("float32", "bfloat16")
# The sampling modes --warmup compiles (each is its own program: greedy, temperature, temperature + top_p);
# top_k and n > 1 compile on first use.
WARMUP_MODES = {"greedy": SamplingParams(temperature=0.0), "temperature": SamplingParams(temperature=1.0),
                "top_p": SamplingParams(temperature=1.0, top_p=0.9)}
WARMUP_CONVERSATION = ({"role": "user", "content": "warm-up"},)


def default_max_tokens_buckets(limit: int) -> tuple[int, ...]:
    """Returns the max_new_tokens the server compiles for: powers of two from 16 below `limit`, then `limit`."""
    sizes, b = [], SMALLEST_MAX_TOKENS_BUCKET
    while b < limit:
        sizes.append(b)
        b *= 2
    return (*sizes, int(limit))


def checked_max_tokens_buckets(buckets: Sequence[int] | None, limit: int) -> tuple[int, ...]:
    """Returns `buckets` sorted (None or empty: `default_max_tokens_buckets(limit)`); raises ValueError
    unless all are >= 1 and the largest holds `limit`."""
    sizes = tuple(sorted({int(b) for b in (buckets or ())})) or default_max_tokens_buckets(int(limit))
    if sizes[0] < 1 or sizes[-1] < limit:
        raise ValueError(f"max_tokens_buckets {list(sizes)} must be >= 1 and the largest must hold max_tokens_limit "
                         f"{limit} (e.g. {list(default_max_tokens_buckets(int(limit)))})")
    return sizes


@dataclasses.dataclass(frozen=True)
class ServeSettings:
    """What a ChatServer binds, accepts and batches, validated. No defaults here: SERVE_DEFAULTS holds them
    once, and the CLI's flags take theirs from it (`from_flags`).

    `max_tokens_buckets` (empty: `default_max_tokens_buckets(max_tokens_limit)`) are the generation lengths
    compiled for; the largest must hold max_tokens_limit. `model_name` (None: the chat model's name) is
    the id /v1/models lists and replies carry; a request naming another model gets a 404.
    """

    host: str
    port: int  # 0: any free port
    api_key: str | None  # requests must send 'Authorization: Bearer <key>' (None: no key)
    model_name: str | None
    max_batch: int  # requests batched into one generation at most
    batch_window_s: float  # how long a batch waits for more requests
    max_tokens_limit: int  # the largest max_tokens a request may ask for
    max_tokens_buckets: tuple[int, ...]
    default_max_tokens: int  # a request's max_tokens when it names none (at most max_tokens_limit)
    max_n: int  # choices a request may ask for
    max_body_bytes: int
    max_image_pixels: int  # pixels (width x height) an image may have, read from its header
    max_prompt_bytes: int  # UTF-8 bytes of text a request may hold, counted before tokenizing
    max_pending: int  # requests in progress (bodies being read, queued, generating); more get a 429
    request_timeout_s: float
    warmup: bool  # compile the max_tokens buckets, batch sizes and WARMUP_MODES before serving

    def __post_init__(self):
        for name in ("max_body_bytes", "max_tokens_limit", "max_batch", "max_image_pixels", "max_prompt_bytes",
                     "max_pending", "max_n"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)!r}")
        if self.batch_window_s < 0:
            raise ValueError(f"batch_window_s must be >= 0, got {self.batch_window_s!r}")
        if self.model_name is not None and not str(self.model_name).strip():
            raise ValueError(f"model_name must be a non-empty id, got {self.model_name!r}")
        object.__setattr__(self, "max_tokens_buckets", tuple(int(b) for b in self.max_tokens_buckets))
        checked_max_tokens_buckets(self.max_tokens_buckets, self.max_tokens_limit)

    @classmethod
    def from_flags(cls, flags) -> "ServeSettings":
        """Returns the settings the CLI's flags (define_flags) give; the model keeps its own name (ChatModel.load
        took --model_name)."""
        return cls(host=flags.host, port=flags.port, api_key=flags.api_key or None, model_name=None,
                   max_batch=flags.max_batch, batch_window_s=flags.batch_window_s,
                   max_tokens_limit=flags.max_tokens_limit,
                   max_tokens_buckets=tuple(int(b) for b in flags.max_tokens_buckets),
                   default_max_tokens=SERVE_DEFAULTS.default_max_tokens, max_n=flags.max_n,
                   max_body_bytes=flags.max_body_mib * MiB, max_image_pixels=flags.max_image_pixels,
                   max_prompt_bytes=flags.max_prompt_bytes, max_pending=flags.max_pending,
                   request_timeout_s=SERVE_DEFAULTS.request_timeout_s, warmup=flags.warmup)


# The one place the server's defaults are written: the CLI's flags read them, tests replace fields of them.
SERVE_DEFAULTS = ServeSettings(
    host="127.0.0.1", port=8000, api_key=None, model_name=None, max_batch=8, batch_window_s=0.01,
    max_tokens_limit=4096, max_tokens_buckets=(), default_max_tokens=512, max_n=DEFAULT_MAX_N,
    max_body_bytes=32 * MiB, max_image_pixels=DEFAULT_MAX_IMAGE_PIXELS, max_prompt_bytes=DEFAULT_MAX_PROMPT_BYTES,
    max_pending=DEFAULT_MAX_PENDING, request_timeout_s=600.0, warmup=False)


@dataclasses.dataclass
class _Job:
    """One accepted request waiting for its share of a generation."""

    request: ChatRequest
    done: threading.Event = dataclasses.field(default_factory=threading.Event)
    completions: Any = None  # the request's n Completions, cut at its max_tokens
    error: BaseException | None = None


@dataclasses.dataclass(frozen=True)
class Answer:
    """A request's answer, before it is written as JSON or as a stream of chunks."""

    request: ChatRequest
    reply_id: str
    created: int
    choices: list[ChoiceReply]
    usage: dict[str, int]


@dataclasses.dataclass(frozen=True)
class WarmupReport:
    """What `ChatServer.warmup` ran: generations (one per program shape), XLA compilations, seconds."""

    generations: int
    compiles: int
    seconds: float

class ChatServer:
    """Serves `chat_model` (a ChatModel: `.name`, `.complete(conversations, params, seed=)`,
    `.sample_groups(conversations, n, params, seed=)` for n > 1, and `.tokenizer`, `.image_config`,
    `.max_prompt_tokens` for counting prompts up front; the tokenizer also decodes cut choices).

        settings = dataclasses.replace(SERVE_DEFAULTS, port=0, api_key="k")
        with ChatServer(model, settings) as server:
            client = ChatClient(server.base_url, model.name, api_key="k")

    `base_url` is the OpenAI-style base (http://127.0.0.1:<port>/v1). `stats()` counts requests,
    errors and `complete_calls` (generations run), which is below `completions` when batching works;
    `metrics` holds the same for GET /metrics. Tool requests are served only when `plain_messages` renders
    them as the model's chat template does (`tool_template_error` says why not).
    """

    def __init__(self, chat_model, settings: ServeSettings):
        s = settings
        self.settings = s
        self.chat_model = chat_model
        self.model_name = str(s.model_name if s.model_name is not None else chat_model.name)
        self.max_tokens_buckets = checked_max_tokens_buckets(s.max_tokens_buckets, s.max_tokens_limit)
        self.max_n = int(s.max_n)
        self.host, self._port = s.host, s.port
        self.api_key = s.api_key or None
        self.max_body_bytes = int(s.max_body_bytes)
        self.max_tokens_limit = int(s.max_tokens_limit)
        self.default_max_tokens = min(int(s.default_max_tokens), self.max_tokens_limit)
        self.max_batch = int(s.max_batch)
        self.batch_window_s = float(s.batch_window_s)
        self.request_timeout_s = float(s.request_timeout_s)
        self.max_image_pixels, self.max_prompt_bytes = int(s.max_image_pixels), int(s.max_prompt_bytes)
        self.max_pending = int(s.max_pending)
        self._pending = threading.BoundedSemaphore(self.max_pending)
        from rmsweb_jax.sampling.prompt_budget import PromptBudget  # imports JAX: not at the top, so serve --help loads without it
        self._budget = PromptBudget(chat_model)
        self.created = int(time.time())
        self._jobs: queue.Queue = queue.Queue()
        self._lock = threading.Lock()
        self._seed = 0
        self._stats = {"requests": 0, "completions": 0, "complete_calls": 0, "max_batch_seen": 0, "client_errors": 0,
                       "server_errors": 0, "prompt_tokens": 0, "completion_tokens": 0}
        self._httpd: ChatHTTPServer | None = None
        self._threads: list[threading.Thread] = []
        self._in_progress = 0
        self.metrics = ServeMetrics(queue_depth=self._jobs.qsize, in_progress=lambda: self._in_progress)
        self.tool_template_error = renders_like_template(chat_model.tokenizer)
        self._token_text: TokenText | None = None
        self._top_logprobs = None  # a TopLogprobs, made on first use

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
        """Stops serving: no new connection is taken, the generation in flight finishes and is answered, requests
        still waiting get a 503, and it returns once every admitted request has its reply written (at most
        DRAIN_S after the batcher stopped), so a process that exits next resets no client (idempotent)."""
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
        deadline = time.monotonic() + DRAIN_S
        while self._in_progress and time.monotonic() < deadline:
            time.sleep(0.05)

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
        if not self._pending.acquire(blocking=False):
            return False
        with self._lock:
            self._in_progress += 1
        return True

    def release(self) -> None:
        """Ends a request admitted by admit()."""
        with self._lock:
            self._in_progress -= 1
        self._pending.release()

    # --- one chat completion --------------------------------------------------------------------
    def answer(self, body: Any, reply_id: str | None = None) -> Answer:
        """Returns the answer to a parsed JSON `body` (its id `reply_id`, default a new one); raises RequestError."""
        request = parse_chat_request(body, model_name=self.model_name, max_tokens_limit=self.max_tokens_limit,
                                     default_max_tokens=self.default_max_tokens, max_image_pixels=self.max_image_pixels,
                                     max_prompt_bytes=self.max_prompt_bytes, max_n=self.max_n)
        if request.tool_turns and self.tool_template_error:
            param = "tools" if request.parse_tool_calls else "messages"
            raise RequestError(400, f"{param}: this model's chat template does not write tools, tool calls and tool "
                               f"results in Qwen's format, so they cannot be served ({self.tool_template_error})",
                               param=param, code="unsupported_parameter")
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
        token_text = self.token_text if (request.stream or request.logprobs) else None
        choices = []
        for index, c in enumerate(job.completions):
            tops = (self.top_logprobs.top(request.messages, c, request.params.temperature, request.top_logprobs)
                    if request.top_logprobs else None)
            choices.append(choice_reply(index, c, request.stop, parse_tools=request.parse_tool_calls,
                                        parallel_tool_calls=request.parallel_tool_calls,
                                        logprobs=request.logprobs, top_logprobs=tops, token_text=token_text))
        # The prompt is read once however many choices share it; every returned token counts.
        prompt_tokens = job.completions[0].prompt_tokens
        completion_tokens = sum(c.completion_tokens for c in job.completions)
        self._count(completions=1, prompt_tokens=prompt_tokens, completion_tokens=completion_tokens)
        return Answer(request, reply_id or f"chatcmpl-{uuid.uuid4().hex}", int(time.time()), choices,
                      {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                       "total_tokens": prompt_tokens + completion_tokens})

    def reply_chunks(self, a: Answer) -> list[dict[str, Any]]:
        """Returns the chat.completion.chunk objects that stream answer `a`."""
        return chunk_objects(a.reply_id, a.created, self.model_name, a.choices, a.usage, a.request.include_usage)

    def reply_object(self, a: Answer) -> dict[str, Any]:
        """Returns the chat.completion object of answer `a`."""
        return completion_object(a.reply_id, a.created, self.model_name, a.choices, a.usage)

    @property
    def token_text(self) -> TokenText:
        """Returns the tokenizer's per-token bytes and text pieces (for log-probs and streams; made on first use)."""
        if self._token_text is None:
            self._token_text = TokenText(self.chat_model.tokenizer)
        return self._token_text

    @property
    def top_logprobs(self) -> "TopLogprobs":
        """Returns the scorer of the most likely tokens at each step (made on first use)."""
        if self._top_logprobs is None:
            from rmsweb_jax.sampling.top_logprobs import TopLogprobs
            self._top_logprobs = TopLogprobs(self.chat_model)
        return self._top_logprobs

    def log_request(self, reply_id: str, status: int, answer: Answer | None, latency_s: float,
                    refused: RequestError | None = None) -> None:
        """Writes the one log line of a chat request (a refused one's code and message) and counts it in
        `metrics`."""
        prompt = answer.usage["prompt_tokens"] if answer else 0
        completion = answer.usage["completion_tokens"] if answer else 0
        self.metrics.observe(status, prompt, completion, latency_s)
        user = f" user={answer.request.user}" if answer and answer.request.user else ""
        stream = " stream" if answer and answer.request.stream else ""
        ignored = f" ignored={','.join(answer.request.ignored)}" if answer and answer.request.ignored else ""
        why = f" refused={refused.code}: {refused.message}" if refused is not None else ""
        logging.info("request %s status=%d tokens_in=%d tokens_out=%d latency_s=%.3f%s%s%s%s", reply_id, status,
                     prompt, completion, latency_s, stream, user, ignored, why[:500])

    def warmup(self) -> WarmupReport:
        """Returns what it ran: one generation (a short prompt, its smallest length bucket) per max_tokens
        bucket, batch size the model pads to (up to max_batch) and WARMUP_MODES, so requests of those shapes
        find their programs compiled. Call before serving (it holds the model)."""
        start, compiles_before = time.perf_counter(), compile_count()
        largest = min(self.max_batch, int(getattr(self.chat_model, "max_batch", self.max_batch)))
        runs = 0
        from rmsweb_jax.sampling.chat_model import batch_buckets
        for bucket in self.max_tokens_buckets:
            for size in batch_buckets(largest):  # the batch sizes ChatModel pads to
                for mode in WARMUP_MODES.values():
                    self.chat_model.complete([list(WARMUP_CONVERSATION)] * size,
                                             dataclasses.replace(mode, max_new_tokens=bucket), seed=0)
                    runs += 1
        return WarmupReport(runs, compile_count() - compiles_before, time.perf_counter() - start)

    def models(self) -> dict[str, Any]:
        """Returns the OpenAI model list (this server's one model)."""
        return {"object": "list", "data": [self.model()]}

    def model(self, model_id: str | None = None) -> dict[str, Any]:
        """Returns the OpenAI model object of `model_id` (default: this server's); RequestError 404 for another."""
        if model_id is not None and model_id != self.model_name:
            raise RequestError(404, f"model {model_id!r} is not served here; this server serves {self.model_name!r}",
                               param="model", code="model_not_found")
        return {"id": self.model_name, "object": "model", "created": self.created, "owned_by": "rmsweb_jax",
                "max_model_len": self._budget.max_prompt_tokens}

    def tokenize(self, body: Any) -> dict[str, Any]:
        """Returns vLLM's /tokenize reply ({"count", "max_model_len", "tokens"}) for {"prompt": text} (tokenized as
        is) or {"messages": [...]} (the chat template's prompt, as a completion request would read it)."""
        if not isinstance(body, dict) or ("prompt" in body) == ("messages" in body):
            raise RequestError(400, "request body: expected {\"prompt\": text} or {\"messages\": [...]}",
                               code="invalid_value")
        if body.get("model") not in (None, self.model_name):
            self.model(body["model"])  # the 404
        if "messages" in body:
            parsed = parse_chat_request({"model": self.model_name, "messages": body["messages"]},
                                        model_name=self.model_name, max_tokens_limit=self.max_tokens_limit,
                                        default_max_tokens=1, max_image_pixels=self.max_image_pixels,
                                        max_prompt_bytes=self.max_prompt_bytes, max_n=1)
            tokens = self._budget.prompt_ids(parsed)
        else:
            prompt = body["prompt"]
            if not isinstance(prompt, str) or len(prompt.encode("utf-8", "surrogatepass")) > self.max_prompt_bytes:
                raise RequestError(400, f"prompt: expected a string of at most {self.max_prompt_bytes} UTF-8 bytes, "
                                   f"got {str(prompt)[:40]!r}", param="prompt", code="invalid_value")
            tokens = self.chat_model.tokenizer.encode(prompt, add_special_tokens=False)
        return {"count": len(tokens), "max_model_len": self._budget.max_prompt_tokens, "tokens": list(map(int, tokens))}

    def detokenize(self, body: Any) -> dict[str, Any]:
        """Returns vLLM's /detokenize reply ({"prompt": text}) for {"tokens": [ids]}."""
        tokens = body.get("tokens") if isinstance(body, dict) else None
        vocab = len(self.chat_model.tokenizer)
        if not isinstance(tokens, list) or not all(type(t) is int and 0 <= t < vocab for t in tokens):
            raise RequestError(400, f"tokens: expected a list of token ids in [0, {vocab}), got "
                               f"{str(tokens)[:80]}", param="tokens", code="invalid_value")
        return {"prompt": self.chat_model.tokenizer.decode(tokens)}

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
            for j in batch:  # one generation takes one SamplingParams (max_tokens bucketed), one seed and one n
                groups.setdefault((self._bucketed(j.request.params), j.request.seed, j.request.n), []).append(j)
            for (params, seed, n), jobs in groups.items():
                self._generate(jobs, params, seed, n)

    def _bucketed(self, params: SamplingParams) -> SamplingParams:
        """Returns `params` with max_new_tokens raised to the smallest max_tokens bucket that holds it."""
        bucket = next(b for b in self.max_tokens_buckets if b >= params.max_new_tokens)
        return dataclasses.replace(params, max_new_tokens=bucket)

    def _generate(self, jobs: list[_Job], params: SamplingParams, seed: int | None, n: int) -> None:
        if seed is None:
            with self._lock:
                self._seed += 1
                seed = self._seed
        try:
            self.metrics.generations.inc()
            with self._lock:
                self._stats["complete_calls"] += 1
                self._stats["max_batch_seen"] = max(self._stats["max_batch_seen"], len(jobs))
            conversations = [j.request.messages for j in jobs]
            if n == 1:
                groups = [[c] for c in self.chat_model.complete(conversations, params, seed=seed)]
            else:
                groups = self.chat_model.sample_groups(conversations, n, params, seed=seed)
            if len(groups) != len(jobs) or any(len(g) != n for g in groups):
                raise RuntimeError(f"the model returned {[len(g) for g in groups]} completions for {len(jobs)} "
                                   f"conversations of n = {n}")
            groups = [[_cut(c, j.request.params.max_new_tokens, self.chat_model.tokenizer) for c in g]
                      for j, g in zip(jobs, groups)]
        except Exception as e:  # noqa: BLE001 — handed to the waiting request(s)
            if len(jobs) > 1:  # find the culprit: run each alone so one bad request fails only itself
                for j in jobs:
                    self._generate([j], params, seed, n)
                return
            logging.warning("generation failed: %r", e)
            groups, jobs[0].error = [None], e
        for j, g in zip(jobs, groups):
            j.completions = g
            j.done.set()


def _cut(completion, max_tokens: int, tokenizer):
    """Returns `completion` cut to its first `max_tokens` tokens (finish "length"), or unchanged if it fits.

    A longer completion came from a larger bucket; its first max_tokens tokens hold no stop token (a stop
    token ends a completion), so they are what a run with max_new_tokens = max_tokens returns.
    """
    if completion.completion_tokens <= max_tokens:
        return completion
    ids = completion.token_ids[:max_tokens]
    return dataclasses.replace(completion, text=tokenizer.decode(list(ids), skip_special_tokens=True),
                               completion_tokens=max_tokens, finish_reason="length", token_ids=ids,
                               logprobs=completion.logprobs[:max_tokens])


def serving_config(spec: str, config, dtype: str, mesh_shape: str):
    """Returns the config `ChatModel.load` reads for `spec`: `config` (a run's, for its model runtime, mesh
    and sharding rules; None: float32 on one device), with `dtype` ("float32" | "bfloat16") as the
    parameter and compute dtype and `mesh_shape` ("data,fsdp,tensor", -1 = the remaining devices) as
    the mesh, each when not "". Raises UserError naming the flag."""
    from rmsweb_jax.models.from_config import mesh_from_config
    from rmsweb_jax.sampling.chat_model import loading_config
    cfg = loading_config(spec, config)
    if dtype:
        if dtype not in SERVE_DTYPES:
            raise UserError(f"--dtype={dtype!r}: expected one of {', '.join(SERVE_DTYPES)}")
        cfg.model.param_dtype = cfg.model.compute_dtype = dtype
    if mesh_shape:
        try:
            shape = tuple(int(x) for x in mesh_shape.split(","))
        except ValueError:
            shape = ()
        if len(shape) != 3 or any(x == 0 or x < -1 for x in shape):
            raise UserError(f"--mesh_shape={mesh_shape!r}: expected three sizes data,fsdp,tensor (e.g. 1,4,2; "
                            "-1 = the remaining devices)")
        cfg.mesh.shape = shape
    try:  # a shape the devices cannot fill is refused here, naming the flag, not deep in the loader
        mesh_from_config(cfg)
    except ValueError as err:
        raise UserError(f"--mesh_shape={mesh_shape or tuple(cfg.mesh.shape)}: {err}") from None
    return cfg


def main(argv) -> None:
    """Loads --checkpoint, serves it until interrupted, and prints the URL."""
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    given = flags.FLAGS
    workdir = pathlib.Path(given.workdir or tempfile.mkdtemp(prefix="rmsweb-serve-"))
    try:
        config = serving_config(given.checkpoint, given.config, given.dtype, given.mesh_shape)
        try:  # before loading, which takes minutes for a real checkpoint
            checked_max_tokens_buckets([int(b) for b in given.max_tokens_buckets], given.max_tokens_limit)
        except ValueError as err:
            raise UserError(f"--max_tokens_buckets={','.join(given.max_tokens_buckets)}: expected integers >= 1, "
                            f"the largest >= --max_tokens_limit={given.max_tokens_limit} ({err})") from None
        try:
            settings = ServeSettings.from_flags(given)
        except ValueError as err:  # each field is the flag of its name (max_body_bytes: --max_body_mib)
            raise UserError(f"a serve flag is out of range: {err}") from None
        # The model id clients send: the checkpoint's own name (folder@hash of its weights) unless given.
        from rmsweb_jax.sampling.chat_model import ChatModel
        model = ChatModel.load(given.checkpoint, workdir, config=config,
                               **({"name": given.model_name} if given.model_name else {}))
        server = ChatServer(model, settings)
        if settings.warmup:
            print(f"warming up: max_tokens buckets {server.max_tokens_buckets}, modes {', '.join(WARMUP_MODES)}",
                  flush=True)
            report = server.warmup()
            print(f"warm-up done: {report.generations} generations, {report.compiles} XLA compilations, "
                  f"{report.seconds:.1f} s", flush=True)
    except UserError as err:
        print(f"serve: error: {err}", file=sys.stderr)
        sys.exit(2)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())  # `kill` stops it as cleanly as Ctrl-C
    try:
        with server:  # its close answers the generation in flight and refuses the queue before the model goes
            print(f"serving {model.name} at {server.base_url} (model id {model.name!r}, {config.model.param_dtype}, "
                  f"mesh {tuple(config.mesh.shape)}, max_tokens buckets {server.max_tokens_buckets})", flush=True)
            try:
                while not stop.wait(1.0):
                    pass
            except KeyboardInterrupt:
                pass
    finally:
        model.close()
    print("server stopped", flush=True)


def define_flags(flag_values=None) -> None:
    """Defines the CLI's absl flags in `flag_values` (None: absl's FLAGS; only when run as a program, so
    importing defines none). Their defaults are SERVE_DEFAULTS'."""
    fv = {"flag_values": flags.FLAGS if flag_values is None else flag_values}
    string, integer, float_, list_ = (functools.partial(f, **fv) for f in (
        flags.DEFINE_string, flags.DEFINE_integer, flags.DEFINE_float, flags.DEFINE_list))
    d = SERVE_DEFAULTS
    string("checkpoint", None, "Model to serve: hf:/path/to/checkpoint or random:tiny.")
    string("host", d.host, "Address to bind (127.0.0.1 keeps it off the network).")
    integer("port", d.port, "Port to bind (0: any free port).")
    string("api_key", d.api_key, "If set, requests must send 'Authorization: Bearer <key>'.")
    string("model_name", "", "Model id /v1/models lists, replies carry and requests must send (\"\" = the "
           "checkpoint's name, <folder>@<hash of its weights>, printed at start).")
    flags.DEFINE_alias("served_model_name", "model_name", **fv)  # vLLM's name for it
    config_flags.DEFINE_config_file("config", None, "A run's config file (path[:arg]): its model runtime, mesh and "
                                    "sharding rules are used (default: float32 on one device).", **fv)
    string("dtype", "", f"Parameter and compute dtype: {' | '.join(SERVE_DTYPES)} (\"\" = the config's).")
    string("mesh_shape", "", "Mesh data,fsdp,tensor the parameters are sharded over, e.g. 1,4,2 "
           "(-1 = the remaining devices; \"\" = the config's).")
    string("workdir", None, "Where random:tiny writes its checkpoint (default: a temp dir).")
    integer("max_batch", d.max_batch, "Most requests batched into one generation.")
    float_("batch_window_s", d.batch_window_s, "How long to wait for more requests to batch.")
    integer("max_tokens_limit", d.max_tokens_limit, "Largest max_tokens a request may ask for.")
    list_("max_tokens_buckets", list(d.max_tokens_buckets), "Generation lengths compiled for; a request's "
          "max_tokens runs in the smallest that holds it (empty = powers of two from 16, then max_tokens_limit).")
    integer("max_n", d.max_n, "Most choices (n) a request may ask for.")
    integer("max_body_mib", d.max_body_bytes // MiB, "Largest request body, in MiB.")
    integer("max_image_pixels", d.max_image_pixels,
            "Most pixels (width x height) an image may have; larger ones are refused from their header.")
    integer("max_prompt_bytes", d.max_prompt_bytes,
            "Most UTF-8 bytes of text a request may hold; more is refused before tokenizing.")
    integer("max_pending", d.max_pending, "Most requests in progress; more get a 429.")
    flags.DEFINE_boolean("warmup", d.warmup, "Before serving, compile every max_tokens bucket, batch size and "
                         f"sampling mode ({', '.join(WARMUP_MODES)}) and print how long it took.", **fv)
    flags.mark_flag_as_required("checkpoint", **fv)


if __name__ == "__main__":
    define_flags()
    run_absl_command(main, "serve")
