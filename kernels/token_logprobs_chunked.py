"""Token log-probs by a lax loop over vocabulary chunks: the CPU path, and the memory reference.

Forward: for each chunk W[:, v0:v0+bv], logits [T, bv] = h @ W_chunk / temperature feed the
running log-sum-exp (kernels._logit_tiles); only [T, bv] ever exists. Backward (custom_vjp)
recomputes each chunk's logits and writes dW[:, v0:v0+bv] into the gradient buffer in
place, while dh accumulates in float32. A vocabulary that is not a multiple of the chunk is
finished by one static tail chunk, so W is never padded (padding would copy all of W).

XLA:CPU details that decide the memory figure (found with
`jax.jit(...).lower(...).compile().memory_analysis()`):
* matmuls run in float32 (XLA:CPU upcasts bf16 dots anyway; bf16 is not faster here);
* a bf16 W is sliced as raw uint16 bits and widened by a shift. Slicing the bf16 array
  directly makes XLA:CPU convert the whole W to float32 outside the loop (a 2× W copy);
  the bit view costs one bf16-sized copy instead.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

from kernels import _logit_tiles as tiles

f32 = jnp.float32
DEFAULT_BLOCK_V = 2048


@functools.partial(jax.jit, static_argnames=("temperature", "return_entropy", "block_v"))
def token_logprobs_chunked(hidden, lm_head, targets, *, temperature: float = 1.0,
                           return_entropy: bool = False, block_v: int = DEFAULT_BLOCK_V):
    """Returns (logp [T], entropy [T] or None) for hidden [T, D], lm_head [D, V], targets [T]."""
    out = _chunked(hidden, lm_head, targets, 1.0 / float(temperature), int(block_v),
                   bool(return_entropy))
    return out[0], (out[1] if return_entropy else None)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5))
def _chunked(h, w, y, inv_t, block_v, with_entropy):
    return _forward(h, w, y, inv_t, block_v, with_entropy)[0]


def _chunks(vocab: int, block_v: int):
    """Returns (number of full chunks, width of the tail chunk) for a vocabulary."""
    block_v = min(block_v, vocab)
    return (vocab // block_v, vocab % block_v), block_v


def _bits(w):
    """Returns W in a form XLA:CPU slices without widening all of it (see module docstring)."""
    if w.dtype == jnp.bfloat16:
        return lax.bitcast_convert_type(w, jnp.uint16)
    return w


def _widen(w_chunk):
    """Returns a chunk from `_bits` as float32."""
    if w_chunk.dtype == jnp.uint16:
        return lax.bitcast_convert_type(w_chunk.astype(jnp.uint32) << 16, f32)
    return w_chunk.astype(f32)


def _chunk_logits(h32, w_chunk, v0, y, inv_t):
    """Returns (logits [T, bv] * inv_t, target_hit [T, bv]) for the chunk starting at v0."""
    z = jnp.dot(h32, _widen(w_chunk), preferred_element_type=f32) * inv_t
    cols = lax.broadcasted_iota(jnp.int32, (1, z.shape[1]), 1) + v0
    return z, cols == y[:, None]


def _forward(h, w, y, inv_t, block_v, with_entropy):
    (n_full, tail), bv = _chunks(w.shape[1], block_v)
    h32, w_bits = h.astype(f32), _bits(w)

    def update(stats, w_chunk, v0):
        z, hit = _chunk_logits(h32, w_chunk, v0, y, inv_t)
        return tiles.merge(stats, tiles.tile_stats(z, hit, with_entropy))

    def body(i, stats):
        return update(stats, lax.dynamic_slice_in_dim(w_bits, i * bv, bv, axis=1), i * bv)

    stats = lax.fori_loop(0, n_full, body, tiles.empty_stats(h.shape[0]))
    if tail:
        stats = update(stats, w_bits[:, n_full * bv:], n_full * bv)
    logp, lse, ent = (x[:, 0] for x in tiles.finalize(stats))
    outs = (logp, ent) if with_entropy else (logp,)
    return outs, (h, w, y, lse, ent)


def _backward(inv_t, block_v, with_entropy, residuals, cotangents):
    h, w, y, lse, ent = residuals
    g_logp = cotangents[0][:, None]
    g_ent = cotangents[1][:, None] if with_entropy else None
    (n_full, tail), bv = _chunks(w.shape[1], block_v)
    h32, w_bits = h.astype(f32), _bits(w)

    def grads(w_chunk, v0):
        z, hit = _chunk_logits(h32, w_chunk, v0, y, inv_t)
        dz = tiles.logit_cotangent(z, hit, lse[:, None], ent[:, None], g_logp, g_ent, inv_t)
        d_h = jnp.dot(dz, _widen(w_chunk).T, preferred_element_type=f32)
        d_w = jnp.dot(h32.T, dz, preferred_element_type=f32)
        return d_h, d_w.astype(w.dtype)

    def body(i, carry):
        d_h, d_w = carry
        v0 = i * bv
        dh_chunk, dw_chunk = grads(lax.dynamic_slice_in_dim(w_bits, v0, bv, axis=1), v0)
        return d_h + dh_chunk, lax.dynamic_update_slice_in_dim(d_w, dw_chunk, v0, axis=1)

    # dW is written chunk by chunk into one buffer that becomes the output (no [T, V]).
    init = (jnp.zeros(h.shape, f32), jnp.zeros(w.shape, w.dtype))
    d_h, d_w = lax.fori_loop(0, n_full, body, init)
    if tail:
        dh_chunk, dw_chunk = grads(w_bits[:, n_full * bv:], n_full * bv)
        d_h = d_h + dh_chunk
        d_w = lax.dynamic_update_slice_in_dim(d_w, dw_chunk, n_full * bv, axis=1)
    return d_h.astype(h.dtype), d_w, None


_chunked.defvjp(lambda h, w, y, inv_t, bv, ent: _forward(h, w, y, inv_t, bv, ent), _backward)
