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
from rmsweb_jax.errors import UserError
from rmsweb_jax.models import sharding

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


def loss_head(model, hidden: jax.Array) -> tuple[jax.Array, dict]:
    """Returns (the LM head [D, V] the loss reads, token_logprobs' layout keywords) for `model`'s hidden states.

    On a mesh the head is cast to the compute dtype first (the cast is per device, before any collective), so
    the sharded path gathers W once in bf16 and runs bf16 x bf16 -> f32 dots; its gradient flows back through
    the cast into the float32 master weights. On one device the head is passed as the model holds it.
    """
    lm_head = model.text.lm_head_matrix()
    layout = logprob_layout(model, hidden, lm_head)
    if layout:
        lm_head = lm_head.astype(hidden.dtype)
    return lm_head, layout


def logprob_layout(model, hidden: jax.Array, lm_head: jax.Array) -> dict:
    """Returns token_logprobs' mesh, hidden_spec and lm_head_spec for `model`'s mesh ({} off a mesh).

    hidden [B, L, D] are the model's final hidden states, lm_head [D, V] its `text.lm_head_matrix()`. The
    specs come from the model's rules, as its own parameters and activations are laid out: hidden
    ("batch", "seq", "embed"), lm_head ("embed", "vocab"). A tied head (the embedding transposed) has the
    same spec, since the rules give ("vocab", "embed") the same mesh axes per dim.
    """
    mesh = model.mesh
    if mesh is None or mesh.size == 1:
        return {}
    if hidden.ndim != 3:
        raise ValueError(f"logprob_layout: hidden must be [B, L, D] final hidden states, got shape {hidden.shape}")
    return {"mesh": mesh,
            "hidden_spec": sharding.logical_to_spec(("batch", "seq", "embed"), model.rules, mesh, hidden.shape),
            "lm_head_spec": sharding.logical_to_spec(("embed", "vocab"), model.rules, mesh, lm_head.shape)}


def token_cross_entropy(hidden: jax.Array, lm_head: jax.Array, targets: jax.Array, weights: jax.Array, *,
                        impl: str | None = None, layout: dict | None = None) -> LossParts:
    """Returns (sum_t w_t * -log p(targets_t | hidden_t), sum_t w_t) over every position.

    hidden [..., D] are the final hidden states, lm_head [D, V], targets [...] token ids, weights [...]
    (0 where a position predicts nothing; constants: no gradient flows to them). impl "fused" computes
    the value and its gradients in one pass over token chunks (kernels.weighted_nll_fused: the fastest
    path on CPU); the others take log-probs from kernels.token_logprobs, which never materialises the
    [T, V] logits (see `impl` there; None picks Pallas on TPU, chunked on CPU and GPU).
    Positions with weight 0 contribute nothing to the value or the gradient. layout: token_logprobs'
    mesh keywords (logprob_layout; the fused path runs off a mesh only, see resolve_loss_impl).
    """
    if targets.shape != weights.shape or hidden.shape[:-1] != targets.shape:
        raise ValueError(f"token_cross_entropy: hidden {hidden.shape}, targets {targets.shape} and weights "
                         f"{weights.shape} must share leading dims")
    if impl == "fused":
        return LossParts(weighted_nll_fused(hidden, lm_head, targets, weights),
                         jnp.sum(weights.astype(jnp.float32)))
    logp = token_logprobs(hidden, lm_head, targets, impl=impl, **(layout or {}))
    w = weights.astype(jnp.float32)
    # where(), not a product: a garbage log-prob at a weight-0 position (e.g. a padded target) must not leak.
    nll = jnp.where(w != 0, -logp * w, 0.0)
    return LossParts(jnp.sum(nll), jnp.sum(w))


def resolve_loss_impl(impl: str, mesh) -> str | None:
    """Returns the token_logprobs impl for config.train.loss_impl on `mesh`.

    'auto' on a single CPU device is the fused value-and-gradient path (kernels.weighted_nll_fused);
    elsewhere on a single device the platform default of token_logprobs (Pallas on TPU). On a mesh it
    is the pure-JAX chunked path, in its shard_map form (kernels.token_logprobs_sharded, given the model's
    mesh by logprob_layout): a pallas_call is opaque to XLA's SPMD partitioner, and the fused
    path's token-chunk loop would cut across the sharded batch axis.
    """
    if impl not in LOSS_IMPLS:
        raise UserError(f"config.train.loss_impl = {impl!r}: expected one of {LOSS_IMPLS}")
    if impl == "auto":
        if mesh is not None and mesh.size > 1:
            return "chunked"
        return "fused" if jax.default_backend() == "cpu" else None
    return impl


def make_sft_loss(impl: str | None = None) -> LossFn:
    """Returns the SFT loss: token-weighted next-token cross-entropy of a microbatch (see train.batch)."""
    def sft_loss(model, batch) -> tuple[LossParts, dict]:
        hidden, _ = model.hidden_states(batch.inputs)
        lm_head, layout = loss_head(model, hidden)
        parts = token_cross_entropy(hidden, lm_head, batch.targets, batch.weights, impl=impl, layout=layout)
        return parts, {}
    return sft_loss
