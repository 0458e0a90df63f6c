"""log p(target token) straight from hidden states and the LM head, without [T, V] logits.

    logp[t] = z[t, y_t] - logsumexp_v z[t, v],   z = (h @ W) / temperature

With Qwen's vocabulary of 151,936 the float32 [T, V] logits (and their gradient) dominate the
memory of RL and SFT losses. Every path here tiles the vocabulary with an online
log-sum-exp, and its backward (custom_vjp) recomputes logit tiles instead of keeping them:

  impl="chunked"          lax loop over vocabulary chunks (token_logprobs_chunked); CPU and GPU default.
                          Given a mesh of more than one device, the shard_map version of the same
                          loop (token_logprobs_sharded: one all-gather of W per forward, bf16 dots)
  impl="pallas"           Pallas kernels: Mosaic layout on TPU (token_logprobs_tpu), Triton
                          layout on GPU (token_logprobs_gpu); the default on TPU only
  impl="pallas_interpret" the TPU-layout kernels in interpret mode (runs on CPU; for tests)
  impl="reference"        the naive log_softmax over materialized logits (for checks)

Gradients flow to hidden and lm_head on every path; targets get none.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from kernels import _dispatch
from kernels.token_logprobs_chunked import DEFAULT_BLOCK_V, token_logprobs_chunked
from kernels.token_logprobs_gpu import token_logprobs_gpu
from kernels.token_logprobs_sharded import token_logprobs_sharded
from kernels.token_logprobs_tpu import token_logprobs_tpu

f32 = jnp.float32


def token_logprobs(hidden, lm_head, targets, *, temperature: float = 1.0,
                   return_entropy: bool = False, impl: str | None = None,
                   block_t: int | None = None, block_v: int | None = None, mesh=None,
                   hidden_spec=None, lm_head_spec=None):
    """Returns log p(targets) [...] float32, or (logp, entropy) with return_entropy=True.

    hidden: [..., D] (any float dtype), lm_head: [D, V], targets: [...] integer token ids in
    [0, V) (ids outside it are not checked and give meaningless values: mask them later).
    temperature: a static Python float > 0, applied to the logits before the softmax.
    Entropy is that of the tempered distribution, -sum_v p_v log p_v, in nats.
    block_t / block_v: tile sizes (block_t only matters to the Pallas paths); None picks
    defaults per path (see the modules). impl: see the module docstring.
    mesh, hidden_spec, lm_head_spec: a jax.sharding.Mesh and the PartitionSpecs of hidden and
    lm_head on it; with impl "chunked" and a mesh of more than one device they select
    token_logprobs_sharded (other paths, and single devices, ignore them).
    """
    hidden, lm_head, targets, temperature = _validate(hidden, lm_head, targets, temperature)
    for name, size in (("block_t", block_t), ("block_v", block_v)):
        if size is not None and (not isinstance(size, int) or size <= 0):
            raise ValueError(f"{name} must be a positive int or None, got {size!r}")
    if mesh is not None and (hidden_spec is None or lm_head_spec is None):
        raise ValueError(f"with mesh={mesh} give both hidden_spec and lm_head_spec (PartitionSpecs), "
                         f"got {hidden_spec!r} and {lm_head_spec!r}")
    lead = targets.shape
    h = hidden.reshape(-1, hidden.shape[-1])
    y = targets.reshape(-1).astype(jnp.int32)
    launch = _dispatch.resolve(impl, allowed=_dispatch.IMPLS, cpu_default="chunked")
    if launch.impl == "reference":
        logp, ent = token_logprobs_reference(h, lm_head, y, temperature=temperature)
    elif launch.impl == "chunked" and mesh is not None and mesh.size > 1:
        # Leading dims stay unflattened: shard_map needs the layout of each.
        logp, ent = token_logprobs_sharded(hidden, lm_head, targets, mesh=mesh, hidden_spec=hidden_spec,
                                           lm_head_spec=lm_head_spec, temperature=temperature,
                                           return_entropy=return_entropy,
                                           block_v=block_v or DEFAULT_BLOCK_V)
        return (logp, ent) if return_entropy else logp
    elif launch.impl == "chunked":
        logp, ent = token_logprobs_chunked(h, lm_head, y, temperature=temperature,
                                           return_entropy=return_entropy,
                                           block_v=block_v or DEFAULT_BLOCK_V)
    elif hidden.dtype != lm_head.dtype:  # the kernels' dots take one dtype; h is the small one
        return token_logprobs(hidden.astype(lm_head.dtype), lm_head, targets,
                              temperature=temperature, return_entropy=return_entropy,
                              impl=impl, block_t=block_t, block_v=block_v, mesh=mesh,
                              hidden_spec=hidden_spec, lm_head_spec=lm_head_spec)
    elif launch.platform == "gpu":
        logp, ent = token_logprobs_gpu(h, lm_head, y, temperature=temperature,
                                       return_entropy=return_entropy, block_t=block_t,
                                       block_v=block_v, interpret=launch.interpret)
    else:
        logp, ent = token_logprobs_tpu(h, lm_head, y, temperature=temperature,
                                       return_entropy=return_entropy, block_t=block_t,
                                       block_v=block_v, interpret=launch.interpret)
    if return_entropy:
        return logp.reshape(lead), ent.reshape(lead)
    return logp.reshape(lead)


@functools.partial(jax.jit, static_argnames=("temperature",))
def token_logprobs_reference(hidden, lm_head, targets, *, temperature: float = 1.0):
    """Returns (logp [T], entropy [T]) from fully materialized float32 logits [T, V]."""
    logits = jnp.dot(hidden, lm_head, preferred_element_type=f32) / temperature
    log_probs = jax.nn.log_softmax(logits, axis=-1)
    logp = jnp.take_along_axis(log_probs, targets[:, None], axis=-1)[:, 0]
    entropy = -jnp.sum(jnp.exp(log_probs) * log_probs, axis=-1)
    return logp, entropy


def _validate(hidden, lm_head, targets, temperature):
    hidden, lm_head, targets = (jnp.asarray(x) for x in (hidden, lm_head, targets))
    if hidden.ndim < 2:
        raise ValueError(f"hidden must be [..., D] with at least 2 dims, got {hidden.shape}")
    if lm_head.ndim != 2:
        raise ValueError(f"lm_head must be [D, V], got {lm_head.shape}")
    if lm_head.shape[0] != hidden.shape[-1]:
        raise ValueError(f"lm_head {lm_head.shape} must be [D, V] with D = hidden's last dim "
                         f"(hidden {hidden.shape})")
    if targets.shape != hidden.shape[:-1]:
        raise ValueError(f"targets shape {targets.shape} must equal hidden's leading dims "
                         f"{hidden.shape[:-1]} (hidden {hidden.shape})")
    if not jnp.issubdtype(targets.dtype, jnp.integer):
        raise ValueError(f"targets must hold integer token ids, got dtype {targets.dtype}")
    if not (jnp.issubdtype(hidden.dtype, jnp.floating)
            and jnp.issubdtype(lm_head.dtype, jnp.floating)):
        raise ValueError(f"hidden and lm_head must be floating point, got {hidden.dtype} "
                         f"and {lm_head.dtype}")
    if isinstance(temperature, jax.core.Tracer) or np.ndim(temperature) != 0:
        raise ValueError(f"temperature must be a static Python float, got {temperature!r}")
    temperature = float(temperature)
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    return hidden, lm_head, targets, temperature
