"""TopLogprobs: the most likely tokens at each step of a completion, for OpenAI's `top_logprobs`.

The sampler keeps only the drawn token's log-probability (its decode loop would otherwise carry a
[batch, steps, k] array for every request, asked or not). So the alternatives are scored afterwards, on the
request's own thread: one forward pass over prompt + completion (teacher forcing), and at each completion
position the top k of the same distribution the sampler's log-probs are taken from, the temperature-scaled
one before top-k / top-p truncation (temperature 0: the model's own). The drawn token's log-prob from this
pass equals the sampler's up to float32 summation order; greedy decoding's token is the top one.

Cost: a forward pass of the whole sequence per choice, and one compiled program per padded length
(powers of two, as the sampler's length buckets) and image patch count.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rmsweb_jax.models.qwen3_vl.model import prepare_inputs

SCORED_TOP_K = 20  # one program for every top_logprobs (OpenAI's limit is 20); fewer are sliced off
SMALLEST_LENGTH = 32


def padded_length(n: int) -> int:
    """Returns the power of two (at least SMALLEST_LENGTH) that holds `n` tokens."""
    length = SMALLEST_LENGTH
    while length < n:
        length *= 2
    return length


class TopLogprobs:
    """Scores completions of `chat_model` (its `.model`, `.encode`) for their top alternatives."""

    def __init__(self, chat_model):
        self.chat_model = chat_model

    def top(self, messages, completion, temperature: float, k: int) -> list[list[tuple[int, float]]]:
        """Returns, per generated token of `completion` (of the conversation `messages`), the `k` most likely
        (token id, log-prob) there, most likely first."""
        if not 1 <= k <= SCORED_TOP_K:
            raise ValueError(f"k must be in [1, {SCORED_TOP_K}], got {k}")
        encoded = self.chat_model.encode(messages)
        prompt = [int(t) for t in encoded.input_ids]
        generated = [int(t) for t in completion.token_ids]
        if not generated:
            return []
        ids = prompt + generated
        length = padded_length(len(ids))
        row = np.zeros((1, length), np.int32)
        mask = np.zeros_like(row)
        row[0, :len(ids)], mask[0, :len(ids)] = ids, 1  # right padding: causal attention never sees it
        model = self.chat_model.model
        inputs = prepare_inputs(model.config, row, attention_mask=mask, pixel_values=encoded.pixel_values,
                                image_grid_thw=encoded.image_grid_thw, vision_window=model.runtime.vision_window)
        # Position p's logits predict token p + 1: the first generated token is predicted at the prompt's last.
        positions = np.arange(len(prompt) - 1, len(ids) - 1, dtype=np.int32)
        positions = np.pad(positions, (0, length - len(positions)), constant_values=len(ids) - 1)
        graphdef, state = nnx.split(model)
        scale = np.float32(temperature if temperature > 0 else 1.0)
        values, indices = jax.device_get(_top_k(graphdef, state, inputs, positions[None], scale))
        return [[(int(indices[0, i, j]), float(values[0, i, j])) for j in range(k)] for i in range(len(generated))]


@functools.partial(jax.jit, static_argnums=0)
def _top_k(graphdef, state, inputs, positions, temperature):
    model = nnx.merge(graphdef, state)
    hidden, _ = model.hidden_states(inputs)
    hidden = jnp.take_along_axis(hidden, positions[:, :, None], axis=1)
    logp = jax.nn.log_softmax(model.logits(hidden) / temperature, axis=-1)
    return jax.lax.top_k(logp, SCORED_TOP_K)
