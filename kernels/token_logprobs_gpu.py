"""Token log-probs as Pallas kernels in the GPU (Triton) layout; on CPU via interpret=True.

Triton runs grid programs in parallel with no sequential grid axis and no scratch memory,
and every array value must have a power-of-two size. So, unlike the TPU layout:
  forward   grid (T blocks, V blocks): each program computes its logit tile (D consumed in
            block_d chunks by a loop) and writes that tile's partial log-sum-exp
            statistics to [V blocks, T] arrays; XLA merges the partials (tiny).
  backward  grid (T blocks, V blocks): each program recomputes its tile, forms dz, and adds
            dz @ W_tile^T and h_tile^T @ dz chunk by chunk into float32 dh / dW buffers with
            atomic adds (the Cut-Cross-Entropy scheme). Float atomics make the sum order, and
            so the last bits of the gradients, vary from run to run.
Ragged T, V and D are handled with masked loads (out-of-range elements read as 0); the
atomic-add buffers are padded to whole blocks so no add goes out of bounds. The float32 dW
buffer is W-sized: for a bf16 W it is twice the gradient's size.
"""
from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from kernels import _dispatch
from kernels import _logit_tiles as tiles

f32 = jnp.float32


@dataclasses.dataclass(frozen=True)
class _Config:
    """Static shape and option data baked into the kernels (hashable)."""

    tokens: int
    dim: int
    vocab: int
    block_t: int
    block_v: int
    block_d: int
    inv_t: float
    with_entropy: bool
    interpret: bool
    num_warps: int = 4

    @property
    def grid(self) -> tuple[int, int]:
        return pl.cdiv(self.tokens, self.block_t), pl.cdiv(self.vocab, self.block_v)

    @property
    def d_chunks(self) -> int:
        return pl.cdiv(self.dim, self.block_d)

    @property
    def dim_pad(self) -> int:
        # Blocks span whole D chunks (as jax's GPU attention pads head_dim); loads mask the rest.
        return self.d_chunks * self.block_d


@functools.partial(jax.jit, static_argnames=("temperature", "return_entropy", "block_t",
                                             "block_v", "block_d", "interpret"))
def token_logprobs_gpu(hidden, lm_head, targets, *, temperature: float = 1.0,
                       return_entropy: bool = False, block_t: int | None = None,
                       block_v: int | None = None, block_d: int | None = None,
                       interpret: bool = False):
    """Returns (logp [T], entropy [T] or None) for hidden [T, D], lm_head [D, V], targets [T].

    Block sizes must be powers of two >= 16 (Triton's dot needs 16 on every side).
    """
    (tokens, dim), vocab = hidden.shape, lm_head.shape[1]
    bt = _block(block_t or 64, tokens, "block_t")
    bv = _block(block_v or 128, vocab, "block_v")
    bd = _block(block_d or 64, dim, "block_d")
    cfg = _Config(tokens, dim, vocab, bt, bv, bd, 1.0 / float(temperature),
                  bool(return_entropy), bool(interpret))
    outs = _gpu_logprobs(hidden, lm_head, targets.astype(jnp.int32), cfg)
    return outs[0], (outs[1] if return_entropy else None)


def _block(size: int, extent: int, name: str) -> int:
    if size < 16 or size & (size - 1):
        raise ValueError(f"{name} must be a power of two >= 16 on GPU, got {size}")
    return min(size, max(16, _dispatch.next_pow2(extent)))


def _precision(dtype):
    # float32 inputs get IEEE float32 dots (not TF32); bf16 runs natively into f32.
    return lax.Precision.HIGHEST if dtype == jnp.float32 else None


def _spans(cfg: _Config):
    """Returns (row ids [bt], rows valid [bt], col ids [bv], cols valid [bv]) of this program."""
    i, j = pl.program_id(0), pl.program_id(1)
    rows = i * cfg.block_t + jnp.arange(cfg.block_t)
    cols = j * cfg.block_v + jnp.arange(cfg.block_v)
    return rows, rows < cfg.tokens, cols, cols < cfg.vocab


def _load_chunks(h_ref, w_ref, k, row_ok, col_ok, cfg: _Config):
    """Returns D-chunk k of the h tile [bt, bd] and the W tile [bd, bv], zero out of range."""
    d = k * cfg.block_d + jnp.arange(cfg.block_d)
    d_ok = d < cfg.dim
    h = pltriton.load(h_ref.at[:, pl.ds(k * cfg.block_d, cfg.block_d)],
                      mask=row_ok[:, None] & d_ok[None, :], other=0.0)
    w = pltriton.load(w_ref.at[pl.ds(k * cfg.block_d, cfg.block_d), :],
                      mask=d_ok[:, None] & col_ok[None, :], other=0.0)
    return h, w


def _masked_tile(h_ref, w_ref, y, row_ok, cols, col_ok, cfg: _Config):
    """Returns (masked logits [bt, bv] float32, target_hit) of this program's tile."""
    def add_chunk(k, z):
        h, w = _load_chunks(h_ref, w_ref, k, row_ok, col_ok, cfg)
        return z + lax.dot(h, w, precision=_precision(h.dtype), preferred_element_type=f32)

    z = lax.fori_loop(0, cfg.d_chunks, add_chunk, jnp.zeros((cfg.block_t, cfg.block_v), f32))
    z = tiles.mask_logits(z * cfg.inv_t, col_ok[None, :])
    return z, cols[None, :] == y[:, None]


def _forward_kernel(h_ref, w_ref, y_ref, m_ref, s_ref, a_ref, t_ref, *, cfg: _Config):
    _, row_ok, cols, col_ok = _spans(cfg)
    y = pltriton.load(y_ref, mask=row_ok, other=0)
    z, hit = _masked_tile(h_ref, w_ref, y, row_ok, cols, col_ok, cfg)
    stats = tiles.tile_stats(z, hit, cfg.with_entropy)
    for ref, value in zip((m_ref, s_ref, a_ref, t_ref), stats):
        ref[...] = value[:, 0]


def _forward(h, w, y, cfg: _Config):
    """Returns (logp, lse, entropy), each [T] float32 (entropy meaningful only with_entropy)."""
    grid_t, grid_v = cfg.grid
    t_pad = grid_t * cfg.block_t
    part = pl.BlockSpec((None, cfg.block_t), lambda i, j: (j, i))
    partials = pl.pallas_call(
        functools.partial(_forward_kernel, cfg=cfg),
        grid=(grid_t, grid_v),
        in_specs=[pl.BlockSpec((cfg.block_t, cfg.dim_pad), lambda i, j: (i, 0)),
                  pl.BlockSpec((cfg.dim_pad, cfg.block_v), lambda i, j: (0, j)),
                  pl.BlockSpec((cfg.block_t,), lambda i, j: (i,))],
        out_specs=[part] * 4,
        out_shape=[jax.ShapeDtypeStruct((grid_v, t_pad), f32)] * 4,
        compiler_params=pltriton.CompilerParams(num_warps=cfg.num_warps, num_stages=2),
        interpret=cfg.interpret,
        name="token_logprobs_fwd_gpu",
    )(h, w, y)
    # Merge the V-block partials: [grid_v, T] -> [T]. Each is max / exp-weighted sums.
    m, s, a, tgt = (p[:, :cfg.tokens] for p in partials)
    big_m = jnp.max(m, axis=0)
    scale = jnp.exp(m - big_m)
    merged = tiles.RowStats(big_m[:, None], jnp.sum(s * scale, axis=0)[:, None],
                            jnp.sum(scale * (a + s * (m - big_m)), axis=0)[:, None],
                            jnp.sum(tgt, axis=0)[:, None])
    return tuple(x[:, 0] for x in tiles.finalize(merged))


def _backward_kernel(h_ref, w_ref, y_ref, lse_ref, ent_ref, g_ref, ge_ref, _dh0, _dw0,
                     dh_ref, dw_ref, *, cfg: _Config):
    i, j = pl.program_id(0), pl.program_id(1)
    _, row_ok, cols, col_ok = _spans(cfg)
    y, lse, ent, g, g_ent = (pltriton.load(ref, mask=row_ok, other=0)[:, None]
                             for ref in (y_ref, lse_ref, ent_ref, g_ref, ge_ref))
    z, hit = _masked_tile(h_ref, w_ref, y[:, 0], row_ok, cols, col_ok, cfg)
    dz = tiles.logit_cotangent(z, hit, lse, ent, g, g_ent if cfg.with_entropy else None,
                               cfg.inv_t)
    dz = jnp.where(row_ok[:, None] & col_ok[None, :], dz, 0.0).astype(h_ref.dtype)

    def scatter_chunk(k, carry):
        h, w = _load_chunks(h_ref, w_ref, k, row_ok, col_ok, cfg)
        d_h = lax.dot_general(dz, w, (((1,), (1,)), ((), ())),
                              precision=_precision(h.dtype), preferred_element_type=f32)
        d_w = lax.dot_general(h, dz, (((0,), (0,)), ((), ())),
                              precision=_precision(h.dtype), preferred_element_type=f32)
        d_slice = pl.ds(k * cfg.block_d, cfg.block_d)
        pltriton.atomic_add(dh_ref, (pl.ds(i * cfg.block_t, cfg.block_t), d_slice), d_h)
        pltriton.atomic_add(dw_ref, (d_slice, pl.ds(j * cfg.block_v, cfg.block_v)), d_w)
        return carry

    lax.fori_loop(0, cfg.d_chunks, scatter_chunk, 0)


def _backward(h, w, y, lse, ent, g, g_ent, cfg: _Config):
    """Returns (dh, dW) in the dtypes of h and W."""
    grid_t, grid_v = cfg.grid
    t_pad, v_pad = grid_t * cfg.block_t, grid_v * cfg.block_v
    d_pad = cfg.dim_pad
    whole = lambda shape: pl.BlockSpec(shape, lambda i, j: (0, 0))  # noqa: E731
    row = pl.BlockSpec((cfg.block_t,), lambda i, j: (i,))
    dh, dw = pl.pallas_call(
        functools.partial(_backward_kernel, cfg=cfg),
        grid=(grid_t, grid_v),
        in_specs=[pl.BlockSpec((cfg.block_t, cfg.dim_pad), lambda i, j: (i, 0)),
                  pl.BlockSpec((cfg.dim_pad, cfg.block_v), lambda i, j: (0, j)),
                  row, row, row, row, row,
                  whole((t_pad, d_pad)), whole((d_pad, v_pad))],
        out_specs=[whole((t_pad, d_pad)), whole((d_pad, v_pad))],
        out_shape=[jax.ShapeDtypeStruct((t_pad, d_pad), f32),
                   jax.ShapeDtypeStruct((d_pad, v_pad), f32)],
        input_output_aliases={7: 0, 8: 1},  # the zero buffers the atomics add into
        compiler_params=pltriton.CompilerParams(num_warps=cfg.num_warps, num_stages=1),
        interpret=cfg.interpret,
        name="token_logprobs_bwd_gpu",
    )(h, w, y, lse, ent, g, g_ent, jnp.zeros((t_pad, d_pad), f32),
      jnp.zeros((d_pad, v_pad), f32))
    return (dh[:cfg.tokens, :cfg.dim].astype(h.dtype),
            dw[:cfg.dim, :cfg.vocab].astype(w.dtype))


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _gpu_logprobs(h, w, y, cfg: _Config):
    return _fwd(h, w, y, cfg)[0]


def _fwd(h, w, y, cfg: _Config):
    logp, lse, ent = _forward(h, w, y, cfg)
    primal = (logp, ent) if cfg.with_entropy else (logp,)
    return primal, (h, w, y, lse, ent)


def _bwd(cfg: _Config, residuals, cotangents):
    h, w, y, lse, ent = residuals
    g = cotangents[0]
    g_ent = cotangents[1] if cfg.with_entropy else jnp.zeros_like(g)
    d_h, d_w = _backward(h, w, y, lse, ent, g, g_ent, cfg)
    return d_h, d_w, None


_gpu_logprobs.defvjp(_fwd, _bwd)
