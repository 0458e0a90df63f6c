"""Log-softmax over a vocabulary seen one tile at a time: the math every token-logprob path shares.

A tile is a [rows, cols] block of logits z. Running statistics per row ([rows, 1] arrays):
  m   max logit so far
  s   sum exp(z - m)
  a   sum exp(z - m) * (z - m)         (only for entropy)
  tgt the target token's logit (0 until its tile is seen)
From them: lse = m + log s, log p(target) = tgt - lse, entropy = log s - a / s.

Columns outside the vocabulary are set to MASKED, a finite large negative number: exp of it
is exactly 0 and 0 * MASKED is 0, so no inf * 0 = NaN can appear (the same holds for the
initial m). These functions are plain jnp: they run inside Pallas kernels (TPU and GPU) and
in the lax loop of the CPU path alike.
"""
from __future__ import annotations

from typing import NamedTuple

import jax.numpy as jnp

MASKED = -1e30
f32 = jnp.float32


class RowStats(NamedTuple):
    """Running log-sum-exp statistics, each [rows, 1] float32."""

    m: jnp.ndarray
    s: jnp.ndarray
    a: jnp.ndarray
    tgt: jnp.ndarray


def empty_stats(rows: int) -> RowStats:
    """Returns the statistics of zero columns."""
    zeros = jnp.zeros((rows, 1), f32)
    return RowStats(jnp.full((rows, 1), MASKED, f32), zeros, zeros, zeros)


def mask_logits(z, col_valid):
    """Returns z with columns outside the vocabulary set to MASKED."""
    return jnp.where(col_valid, z, MASKED)


def tile_stats(z, target_hit, with_entropy: bool) -> RowStats:
    """Returns the statistics of one masked logit tile z [rows, cols].

    target_hit: [rows, cols] bool, True where the column is the row's target token.
    """
    m = jnp.max(z, axis=1, keepdims=True)
    e = jnp.exp(z - m)
    s = jnp.sum(e, axis=1, keepdims=True)
    a = jnp.sum(e * (z - m), axis=1, keepdims=True) if with_entropy else jnp.zeros_like(s)
    tgt = jnp.sum(jnp.where(target_hit, z, 0.0), axis=1, keepdims=True)
    return RowStats(m, s, a, tgt)


def merge(x: RowStats, y: RowStats) -> RowStats:
    """Returns the statistics of the union of two disjoint column sets."""
    m = jnp.maximum(x.m, y.m)
    dx, dy = x.m - m, y.m - m  # <= 0, finite
    cx, cy = jnp.exp(dx), jnp.exp(dy)
    s = x.s * cx + y.s * cy
    # a is kept relative to m: re-centering adds s * (old m - new m).
    a = cx * (x.a + x.s * dx) + cy * (y.a + y.s * dy)
    return RowStats(m, s, a, x.tgt + y.tgt)


def finalize(st: RowStats):
    """Returns (log p(target), lse, entropy), each [rows, 1]."""
    log_s = jnp.log(st.s)
    lse = st.m + log_s
    return st.tgt - lse, lse, log_s - st.a / st.s


def logit_cotangent(z, target_hit, lse, entropy, g_logp, g_entropy, inv_t: float):
    """Returns d loss / d (h @ W) for one tile, given cotangents of log p(target) and entropy.

    z: masked logits [rows, cols] (already divided by the temperature); lse, entropy,
    g_logp, g_entropy: [rows, 1]; g_entropy may be None (entropy not returned).
      d logp / dz_v    = 1[v = target] - p_v
      d entropy / dz_v = -p_v (log p_v + entropy)
    and z = (h @ W) * inv_t adds the factor inv_t. Masked columns give exactly 0.
    """
    log_p = z - lse
    p = jnp.exp(log_p)
    dz = g_logp * (jnp.where(target_hit, 1.0, 0.0) - p)
    if g_entropy is not None:
        dz = dz - g_entropy * p * (log_p + entropy)
    return dz * inv_t if inv_t != 1.0 else dz
