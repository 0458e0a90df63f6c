"""FlaxPolicy: the Policy interface over our in-process Qwen3-VL (ChatModel + the shared PromptBuilder)."""
from __future__ import annotations

import threading
from typing import Sequence

from rmsweb_jax.sampling.chat_model import ChatModel
from rmsweb_jax.agents.policy import PolicyOutput, ReflectionRequest, StepContext
from rmsweb_jax.agents.prompt import PromptBuilder
from rmsweb_jax.sampling.sampler import SamplingParams

STAT_KEYS = ("calls", "steps", "reflections", "prompt_tokens", "completion_tokens", "parse_errors", "truncated")


class FlaxPolicy:
    """Chooses actions for a batch of episodes with one `ChatModel.complete` call per `act`.

    Each call samples with seed `seed + call index`, so repeated calls on the same context draw
    fresh samples when temperature > 0 and a rerun of the same call sequence repeats them.
    `reflection_params` (default: `params`) decode reflections. The chat model is shared, not
    owned: `close()` closes it only when `owns_model` is set. The policy's name (stored with every
    attempt it plays) is "flax:<chat model name>", which for a loaded checkpoint is
    "<folder>@<weights hash>" (sampling/chat_model.py checkpoint_name): each checkpoint its own.
    """

    def __init__(self, chat_model: ChatModel, prompt_builder: PromptBuilder,
                 params: SamplingParams = SamplingParams(max_new_tokens=256), *, name: str | None = None,
                 reflection_params: SamplingParams | None = None, seed: int = 0, owns_model: bool = False):
        self.chat_model = chat_model
        self.prompt_builder = prompt_builder
        self.params = params
        self.reflection_params = reflection_params or params
        self.name = name or f"flax:{chat_model.name}"
        self.seed, self.owns_model = int(seed), owns_model
        self._counts = dict.fromkeys(STAT_KEYS, 0)
        self._lock = threading.Lock()
        self._closed = False

    def _next_seed(self) -> int:
        with self._lock:
            if self._closed:
                raise RuntimeError(f"policy {self.name!r} is closed")
            return self.seed + self._counts["calls"] + self._counts["reflections"]

    def act(self, contexts: Sequence[StepContext]) -> list[PolicyOutput]:
        """Returns one PolicyOutput per context, in order (action None + error when unparseable)."""
        if not contexts:
            return []
        conversations = [self.prompt_builder.messages(ctx) for ctx in contexts]
        completions = self.chat_model.complete(conversations, self.params, seed=self._next_seed())
        outputs = [PolicyOutput.from_text(c.text, ctx.observation, prompt_tokens=c.prompt_tokens,
                                          completion_tokens=c.completion_tokens, logprobs=c.logprobs)
                   for c, ctx in zip(completions, contexts)]
        with self._lock:
            self._counts["calls"] += 1
            self._counts["steps"] += len(contexts)
            self._counts["prompt_tokens"] += sum(c.prompt_tokens for c in completions)
            self._counts["completion_tokens"] += sum(c.completion_tokens for c in completions)
            self._counts["parse_errors"] += sum(o.action is None for o in outputs)
            self._counts["truncated"] += sum(c.finish_reason == "length" for c in completions)
        return outputs

    def reflect(self, request: ReflectionRequest) -> str:
        """Returns the model's reflection on a failed attempt (plain text, stripped)."""
        messages = self.prompt_builder.reflection_messages(request)
        completion = self.chat_model.complete([messages], self.reflection_params, seed=self._next_seed())[0]
        with self._lock:
            self._counts["reflections"] += 1
            self._counts["prompt_tokens"] += completion.prompt_tokens
            self._counts["completion_tokens"] += completion.completion_tokens
        return completion.text.strip()

    def stats(self) -> dict[str, int]:
        """Returns counts: act calls, steps (contexts), reflections, prompt/completion tokens, parse errors,
        completions cut off by max_new_tokens."""
        with self._lock:
            return dict(self._counts)

    def close(self) -> None:
        """Stops the policy; closes the chat model too when this policy owns it."""
        with self._lock:
            self._closed = True
        if self.owns_model:
            self.chat_model.close()
