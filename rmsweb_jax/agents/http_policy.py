"""HttpPolicy: a Policy served by any OpenAI-compatible chat-completions endpoint.

Each context's prompt (the shared PromptBuilder's messages, screenshots as data URLs) is sent
as its own request, concurrently, bounded by the client's concurrency; a server that batches
(ours, vLLM, SGLang) then batches them again on its side. A failed request costs only its own
context: it comes back as a PolicyOutput with no action and the error, never as an exception
that would lose the rest of the batch.
"""
from __future__ import annotations

import concurrent.futures
import threading
from typing import Sequence

from absl import logging

from rmsweb_jax.agents.chat_client import ChatClient, ChatError
from rmsweb_jax.agents.policy import PolicyOutput, ReflectionRequest, StepContext


class HttpPolicy:
    """Chooses actions and writes reflections through a ChatClient.

    `prompt_builder` provides `messages(ctx) -> list[dict]` and `reflection_messages(req) ->
    list[dict]`. `stats()` adds the client's HTTP counts (prefixed "http_") to the policy's own.
    """

    def __init__(self, client: ChatClient, prompt_builder, *, max_tokens: int = 256, temperature: float = 0.0,
                 reflection_max_tokens: int | None = None, name: str | None = None):
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens!r}")
        if temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {temperature!r}")
        self.client = client
        self.prompt_builder = prompt_builder
        self.max_tokens = int(max_tokens)
        self.temperature = float(temperature)
        self.reflection_max_tokens = int(reflection_max_tokens or max_tokens)
        self.name = name or f"http:{client.model}"
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=client.max_concurrency,
                                                           thread_name_prefix="http-policy")
        self._lock = threading.Lock()
        # The same keys as FlaxPolicy's, so reports compare policies directly; plus request errors.
        self._stats = {"calls": 0, "steps": 0, "reflections": 0, "prompt_tokens": 0, "completion_tokens": 0,
                       "parse_errors": 0, "truncated": 0, "errors": 0}
        self.last_errors: list[str] = []  # the most recent request errors (at most 20), for logs

    def act(self, contexts: Sequence[StepContext]) -> list[PolicyOutput]:
        """Returns one PolicyOutput per context, in order; a failed request gives action None + error."""
        if not contexts:
            return []
        self._count(calls=1)
        futures = [self._pool.submit(self._act_one, ctx) for ctx in contexts]
        return [f.result() for f in futures]

    def reflect(self, request: ReflectionRequest) -> str:
        """Returns the reflection text for a failed attempt; raises ChatError if the endpoint fails."""
        messages = self.prompt_builder.reflection_messages(request)
        self._count(reflections=1)
        try:
            result = self.client.complete(messages, max_tokens=self.reflection_max_tokens,
                                          temperature=self.temperature)
        except ChatError as e:
            self._record_error(f"reflect {request.key or request.task_id}: {e}")
            raise
        self._count(prompt_tokens=result.prompt_tokens, completion_tokens=result.completion_tokens)
        return result.text.strip()

    def stats(self) -> dict[str, int]:
        """Returns counts: act calls, steps (contexts), reflections, prompt/completion tokens, parse
        errors, truncated (replies cut by max_tokens), errors (failed requests), and the client's
        HTTP counts as http_calls, http_requests, http_retries, http_failures, ...."""
        with self._lock:
            out = dict(self._stats)
        out.update({f"http_{k}": v for k, v in self.client.stats().items()})
        return out

    def close(self) -> None:
        """Stops the request threads and closes the client."""
        self._pool.shutdown(wait=True)
        self.client.close()

    def __enter__(self) -> "HttpPolicy":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # --- internals ------------------------------------------------------------------------------
    def _act_one(self, ctx: StepContext) -> PolicyOutput:
        self._count(steps=1)
        try:
            messages = self.prompt_builder.messages(ctx)
            result = self.client.complete(messages, max_tokens=self.max_tokens, temperature=self.temperature)
        except ChatError as e:
            error = f"request failed ({'HTTP ' + str(e.status) if e.status else 'no reply'}): {e}"
            self._record_error(f"act {ctx.key or ctx.task_id}: {error}")
            return PolicyOutput(text="", error=error)
        self._count(prompt_tokens=result.prompt_tokens, completion_tokens=result.completion_tokens,
                    truncated=int(result.finish_reason == "length"))
        output = PolicyOutput.from_text(result.text, ctx.observation, prompt_tokens=result.prompt_tokens,
                                        completion_tokens=result.completion_tokens)
        if output.action is None:
            self._count(parse_errors=1)
        return output

    def _count(self, **deltas: int) -> None:
        with self._lock:
            for key, value in deltas.items():
                self._stats[key] += value

    def _record_error(self, message: str) -> None:
        logging.warning("%s: %s", self.name, message)
        with self._lock:
            self._stats["errors"] += 1
            self.last_errors = [*self.last_errors[-19:], message]
