"""Forward-only token log-probs of a prepared batch: log p(target_t | prefix) at every weighted position.

What mining reads as the cheap signal of a state (log p(reference action | state): the sum over the
action's target tokens) and what Salvage-DS needs as old and reference log-probs of sampled ids.
One forward pass per microbatch and no gradient. The log-softmax goes through
kernels.token_logprobs, so the [T, V] logits are never built; "fused" (the CPU training default)
exists only as a value-and-gradient path, so here it falls back to the chunked kernel, which gives
the same log-probs.
"""
from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

from kernels.token_logprobs import token_logprobs
from rmsweb_jax.train.batch import TrainBatch
from rmsweb_jax.train.loss import loss_head
from rmsweb_jax.train.step import ModelParts


def logprob_fn(parts: ModelParts, impl: str | None = None) -> Callable[[dict, TrainBatch], jax.Array]:
    """Returns the un-jitted fn(params, batch) -> [M, b, L] float32 log p(batch.targets), 0 where
    batch.weights is 0 (padding, prompt tokens, the last position); `impl` as token_logprobs takes it."""
    impl = "chunked" if impl == "fused" else impl

    def microbatch(params, mb: TrainBatch) -> jax.Array:
        model = parts.merge(params)
        hidden, _ = model.hidden_states(mb.inputs)
        lm_head, layout = loss_head(model, hidden)
        logp = token_logprobs(hidden, lm_head, mb.targets, impl=impl, **layout)
        # where(), not a product: a garbage log-prob at a padded position must not leak into sums.
        return jnp.where(mb.weights != 0, logp, 0.0)

    def fn(params, batch: TrainBatch) -> jax.Array:
        return jax.lax.map(lambda mb: microbatch(jax.lax.stop_gradient(params), mb), batch)

    return fn


def token_logprobs_of(parts: ModelParts, batch: TrainBatch, impl: str | None = None) -> jax.Array:
    """Returns [M, b, L] log p(target | prefix) of a placed batch (see logprob_fn), jitted."""
    return jax.jit(logprob_fn(parts, impl))(parts.params, batch)


def sequence_logprobs(token_logps: jax.Array, weights: jax.Array) -> jax.Array:
    """Returns [..., b] the weight-masked sum of token log-probs per row: log p(weighted span | prefix)
    when the weights mark one span (e.g. a reference action's tokens) with 1."""
    return jnp.sum(jnp.where(weights != 0, token_logps * weights, 0.0), axis=-1)
