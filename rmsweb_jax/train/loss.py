"""Token-weighted losses returned as (sum, denominator), so gradient accumulation stays exact.

The mean over a batch is sum / denominator of the whole batch. Summing both parts over
microbatches first and dividing once gives the same number as one big batch, whatever the
token counts of the microbatches (a mean of per-microbatch means would not).
"""
from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp

from kernels.token_logprobs import token_logprobs
from kernels.weighted_nll_fused import weighted_nll_fused

LOSS_IMPLS = ("auto", "fused", "chunked", "reference", "pallas", "pallas_interpret")


class LossParts(NamedTuple):
    """A loss as its numerator and denominator (the loss is sum / max(denominator, 1))."""
    sum: jax.Array          # [] float32
    denominator: jax.Array  # [] float32

    def value(self) -> jax.Array:
        """Returns sum / denominator (0 when nothing is weighted)."""
        return self.sum / jnp.maximum(self.denominator, 1.0)


# loss_fn(model, microbatch) -> (LossParts, aux {name: aux_metrics.Mean | Min | Max, or a scalar to sum})
LossFn = Callable[..., tuple[LossParts, dict]]


def token_cross_entropy(hidden: jax.Array, lm_head: jax.Array, targets: jax.Array, weights: jax.Array, *,
                        impl: str | None = None) -> LossParts:
    """Returns (sum_t w_t * -log p(targets_t | hidden_t), sum_t w_t) over every position.

    hidden [..., D] are the final hidden states, lm_head [D, V], targets [...] token ids, weights [...]
    (0 where a position predicts nothing; constants: no gradient flows to them). impl "fused" computes
    the value and its gradients in one pass over token chunks (kernels.weighted_nll_fused: the fastest
    path on CPU); the others take log-probs from kernels.token_logprobs, which never materialises the
    [T, V] logits (see `impl` there; None picks Pallas on TPU, chunked on CPU and GPU).
    Positions with weight 0 contribute nothing to the value or the gradient.
    """
    if targets.shape != weights.shape or hidden.shape[:-1] != targets.shape:
        raise ValueError(f"token_cross_entropy: hidden {hidden.shape}, targets {targets.shape} and weights "
                         f"{weights.shape} must share leading dims")
    if impl == "fused":
        return LossParts(weighted_nll_fused(hidden, lm_head, targets, weights),
                         jnp.sum(weights.astype(jnp.float32)))
    logp = token_logprobs(hidden, lm_head, targets, impl=impl)
    w = weights.astype(jnp.float32)
    # where(), not a product: a garbage log-prob at a weight-0 position (e.g. a padded target) must not leak.
    nll = jnp.where(w != 0, -logp * w, 0.0)
    return LossParts(jnp.sum(nll), jnp.sum(w))


def resolve_loss_impl(impl: str, mesh) -> str | None:
    """Returns the token_logprobs impl for config.train.loss_impl on `mesh`.

    'auto' on a single CPU device is the fused value-and-gradient path (kernels.weighted_nll_fused);
    elsewhere on a single device the platform default of token_logprobs (Pallas on TPU). On a mesh it
    is the pure-JAX chunked path: a pallas_call is opaque to XLA's SPMD partitioner, and the fused
    path's token-chunk loop would cut across the sharded batch axis.
    """
    if impl not in LOSS_IMPLS:
        raise ValueError(f"config.train.loss_impl = {impl!r}: expected one of {LOSS_IMPLS}")
    if impl == "auto":
        if mesh is not None and mesh.size > 1:
            return "chunked"
        return "fused" if jax.default_backend() == "cpu" else None
    return impl


def make_sft_loss(impl: str | None = None) -> LossFn:
    """Returns the SFT loss: token-weighted next-token cross-entropy of a microbatch (see train.batch)."""
    def sft_loss(model, batch) -> tuple[LossParts, dict]:
        hidden, _ = model.hidden_states(batch.inputs)
        parts = token_cross_entropy(hidden, model.text.lm_head_matrix(), batch.targets, batch.weights, impl=impl)
        return parts, {}
    return sft_loss
