"""Token log-probs as Pallas kernels in the TPU (Mosaic) layout; on CPU via interpret=True.

Three kernels, none of which holds more than one [block_t, block_v] logit tile:
  forward  grid (T blocks, V blocks), V sequential: online log-sum-exp in VMEM scratch;
           writes logp, lse (and entropy) at the last V block.
  dh       grid (T blocks, V blocks), V sequential: recomputes the tile, accumulates
           dz @ W_tile^T into a float32 [block_t, D] scratch.
  dW       grid (V blocks, T blocks), T sequential: recomputes the tile, accumulates
           h_tile^T @ dz into a float32 [D, block_v] scratch.
The contraction dim D stays whole in every block (h: [block_t, D], W: [D, block_v]).

Mosaic tiling rules (checked by Pallas when lowering for TPU): the last two dims of every
block must be multiples of (8, 128) or equal the array's dims. Hence block_t % 8 == 0 and
block_v % 128 == 0 (or the block covers the whole axis); per-row vectors travel as [T, 1]
arrays whose last dim equals the array's. Ragged tails (T or V not a multiple of the block)
are not padded (padding W would copy it): edge blocks read undefined values past the end,
which the kernels mask (logits to MASKED, operands of the gradient matmuls to 0) and whose
writes Pallas drops.
"""
from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from kernels import _logit_tiles as tiles

f32 = jnp.float32
_W_BLOCK_BYTES = 2 * 1024 * 1024  # W tile budget: working sets stay well under the VMEM limit
_VMEM_LIMIT = 32 * 1024 * 1024  # fits v5e/v6e (128 MiB VMEM) and v7x (64 MiB)


@dataclasses.dataclass(frozen=True)
class _Config:
    """Static shape and option data baked into the kernels (hashable)."""

    tokens: int
    vocab: int
    block_t: int
    block_v: int
    inv_t: float
    with_entropy: bool
    interpret: bool

    @property
    def grid_t(self) -> int:
        return pl.cdiv(self.tokens, self.block_t)

    @property
    def grid_v(self) -> int:
        return pl.cdiv(self.vocab, self.block_v)

    @property
    def ragged_t(self) -> bool:
        return self.tokens % self.block_t != 0

    @property
    def ragged_v(self) -> bool:
        return self.vocab % self.block_v != 0


@functools.partial(jax.jit, static_argnames=("temperature", "return_entropy", "block_t",
                                             "block_v", "interpret"))
def token_logprobs_tpu(hidden, lm_head, targets, *, temperature: float = 1.0,
                       return_entropy: bool = False, block_t: int | None = None,
                       block_v: int | None = None, interpret: bool = False):
    """Returns (logp [T], entropy [T] or None) for hidden [T, D], lm_head [D, V], targets [T]."""
    (tokens, dim), vocab = hidden.shape, lm_head.shape[1]
    bt = _block(block_t or 256, tokens, 8, "block_t")
    default_v = max(128, (_W_BLOCK_BYTES // (dim * lm_head.dtype.itemsize)) // 128 * 128)
    bv = _block(block_v or min(default_v, 2048), vocab, 128, "block_v")
    cfg = _Config(tokens, vocab, bt, bv, 1.0 / float(temperature), bool(return_entropy),
                  bool(interpret))
    outs = _tpu_logprobs(hidden, lm_head, targets.astype(jnp.int32).reshape(tokens, 1), cfg)
    return outs[0][:, 0], (outs[1][:, 0] if return_entropy else None)


def _block(size: int, extent: int, multiple: int, name: str) -> int:
    """Returns a block size valid under Mosaic's rule: a multiple of `multiple`, or the extent."""
    if size >= extent:
        return extent
    if size % multiple:
        raise ValueError(f"{name} must be a multiple of {multiple} on TPU (or >= the axis "
                         f"length {extent}), got {size}")
    return size


def _precision(dtype):
    # float32 inputs get exact float32 matmuls; bf16 multiplies natively with f32 accumulation.
    return lax.Precision.HIGHEST if dtype == jnp.float32 else None


def _masked_tile(h, w, y, j, cfg: _Config):
    """Returns (masked logits, target_hit) of V block j for the loaded tiles h, w, y."""
    z = lax.dot(h, w, precision=_precision(h.dtype), preferred_element_type=f32) * cfg.inv_t
    cols = j * cfg.block_v + lax.broadcasted_iota(jnp.int32, (1, cfg.block_v), 1)
    if cfg.ragged_v:
        z = tiles.mask_logits(z, cols < cfg.vocab)
    return z, cols == y


def _row_valid(i, cfg: _Config):
    rows = i * cfg.block_t + lax.broadcasted_iota(jnp.int32, (cfg.block_t, 1), 0)
    return rows < cfg.tokens


# ----------------------------------------------------------------------------- forward


def _forward_kernel(h_ref, w_ref, y_ref, *refs, cfg: _Config):
    n_out = 3 if cfg.with_entropy else 2
    out_refs, scratch = refs[:n_out], refs[n_out:]
    j = pl.program_id(1)

    @pl.when(j == 0)
    def _init():
        for ref, value in zip(scratch, tiles.empty_stats(cfg.block_t)):
            ref[...] = value

    z, hit = _masked_tile(h_ref[...], w_ref[...], y_ref[...], j, cfg)
    running = tiles.RowStats(*(ref[...] for ref in scratch))
    merged = tiles.merge(running, tiles.tile_stats(z, hit, cfg.with_entropy))
    for ref, value in zip(scratch, merged):
        ref[...] = value

    @pl.when(j == cfg.grid_v - 1)
    def _finish():
        logp, lse, ent = tiles.finalize(merged)
        for ref, value in zip(out_refs, (logp, lse, ent)):
            ref[...] = value


def _forward(h, w, y, cfg: _Config):
    """Returns (logp, lse, [entropy]), each [T, 1] float32."""
    dim = h.shape[1]
    row = pl.BlockSpec((cfg.block_t, 1), lambda i, j: (i, 0))
    n_out = 3 if cfg.with_entropy else 2
    return pl.pallas_call(
        functools.partial(_forward_kernel, cfg=cfg),
        grid=(cfg.grid_t, cfg.grid_v),
        in_specs=[pl.BlockSpec((cfg.block_t, dim), lambda i, j: (i, 0)),
                  pl.BlockSpec((dim, cfg.block_v), lambda i, j: (0, j)), row],
        out_specs=[row] * n_out,
        out_shape=[jax.ShapeDtypeStruct((cfg.tokens, 1), f32)] * n_out,
        scratch_shapes=[pltpu.VMEM((cfg.block_t, 1), f32)] * 4,
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary"),
                                             vmem_limit_bytes=_VMEM_LIMIT),
        interpret=cfg.interpret,
        name="token_logprobs_fwd",
    )(h, w, y)


# ----------------------------------------------------------------------------- backward


def _tile_cotangent(h, w, row_refs, t_idx, v_idx, cfg: _Config):
    """Returns dz [block_t, block_v] for the tile (t_idx, v_idx); zero outside T and V."""
    y, lse, ent, g, g_ent = (ref[...] if ref is not None else None for ref in row_refs)
    z, hit = _masked_tile(h, w, y, v_idx, cfg)
    dz = tiles.logit_cotangent(z, hit, lse, ent, g, g_ent, cfg.inv_t)
    if cfg.ragged_t:  # rows past T hold undefined lse / cotangents
        dz = jnp.where(_row_valid(t_idx, cfg), dz, 0.0)
    return dz


def _dh_kernel(h_ref, w_ref, *refs, cfg: _Config):
    *row_refs, dh_ref, acc_ref = refs
    row_refs = _unpack_rows(row_refs, cfg)
    i, j = pl.program_id(0), pl.program_id(1)

    @pl.when(j == 0)
    def _init():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    w = w_ref[...]
    if cfg.ragged_v:  # columns past V are undefined (maybe NaN); NaN * 0 would leak into dh
        cols = j * cfg.block_v + lax.broadcasted_iota(jnp.int32, (1, cfg.block_v), 1)
        w = jnp.where(cols < cfg.vocab, w, jnp.zeros_like(w))
    dz = _tile_cotangent(h_ref[...], w, row_refs, i, j, cfg)
    acc_ref[...] += lax.dot_general(dz.astype(w.dtype), w, (((1,), (1,)), ((), ())),
                                    precision=_precision(w.dtype), preferred_element_type=f32)

    @pl.when(j == cfg.grid_v - 1)
    def _finish():
        dh_ref[...] = acc_ref[...].astype(dh_ref.dtype)


def _dw_kernel(h_ref, w_ref, *refs, cfg: _Config):
    *row_refs, dw_ref, acc_ref = refs
    row_refs = _unpack_rows(row_refs, cfg)
    j, i = pl.program_id(0), pl.program_id(1)  # V block outer, T block inner (reduced)

    @pl.when(i == 0)
    def _init():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    h = h_ref[...]
    if cfg.ragged_t:  # rows past T are undefined (maybe NaN); NaN * 0 would leak into dW
        h = jnp.where(_row_valid(i, cfg), h, jnp.zeros_like(h))
    dz = _tile_cotangent(h, w_ref[...], row_refs, i, j, cfg)
    # h^T @ dz with an explicit transpose, as in jax's TPU flash-attention backward.
    acc_ref[...] += lax.dot(h.T, dz.astype(h.dtype), precision=_precision(h.dtype),
                            preferred_element_type=f32)

    @pl.when(i == cfg.grid_t - 1)
    def _finish():
        dw_ref[...] = acc_ref[...].astype(dw_ref.dtype)


def _unpack_rows(row_refs, cfg: _Config):
    """Returns (y, lse, entropy, g_logp, g_entropy) refs; the entropy pair is None without it."""
    if cfg.with_entropy:
        return tuple(row_refs)
    y, lse, g = row_refs
    return (y, lse, None, g, None)


def _backward_call(kernel, h, w, rows, cfg: _Config, *, transpose_grid: bool):
    dim = h.shape[1]
    if transpose_grid:  # dW: grid (V blocks, T blocks)
        grid = (cfg.grid_v, cfg.grid_t)
        t_of, v_of = (lambda a, b: b), (lambda a, b: a)
        out = (w, pl.BlockSpec((dim, cfg.block_v), lambda a, b: (0, v_of(a, b))),
               pltpu.VMEM((dim, cfg.block_v), f32), "token_logprobs_dw")
    else:  # dh: grid (T blocks, V blocks)
        grid = (cfg.grid_t, cfg.grid_v)
        t_of, v_of = (lambda a, b: a), (lambda a, b: b)
        out = (h, pl.BlockSpec((cfg.block_t, dim), lambda a, b: (t_of(a, b), 0)),
               pltpu.VMEM((cfg.block_t, dim), f32), "token_logprobs_dh")
    like, out_spec, scratch, name = out
    row = pl.BlockSpec((cfg.block_t, 1), lambda a, b: (t_of(a, b), 0))
    return pl.pallas_call(
        functools.partial(kernel, cfg=cfg),
        grid=grid,
        in_specs=[pl.BlockSpec((cfg.block_t, dim), lambda a, b: (t_of(a, b), 0)),
                  pl.BlockSpec((dim, cfg.block_v), lambda a, b: (0, v_of(a, b)))]
        + [row] * len(rows),
        out_specs=out_spec,
        out_shape=jax.ShapeDtypeStruct(like.shape, like.dtype),
        scratch_shapes=[scratch],
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary"),
                                             vmem_limit_bytes=_VMEM_LIMIT),
        interpret=cfg.interpret,
        name=name,
    )(h, w, *rows)


# ----------------------------------------------------------------------------- custom_vjp


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _tpu_logprobs(h, w, y, cfg: _Config):
    return _fwd(h, w, y, cfg)[0]


def _fwd(h, w, y, cfg: _Config):
    outs = _forward(h, w, y, cfg)
    logp, lse = outs[0], outs[1]
    ent = outs[2] if cfg.with_entropy else None
    primal = (logp, ent) if cfg.with_entropy else (logp,)
    return primal, (h, w, y, lse, ent)


def _bwd(cfg: _Config, residuals, cotangents):
    h, w, y, lse, ent = residuals
    if cfg.with_entropy:
        rows = (y, lse, ent, cotangents[0], cotangents[1])
    else:
        rows = (y, lse, cotangents[0])
    d_h = _backward_call(_dh_kernel, h, w, rows, cfg, transpose_grid=False)
    d_w = _backward_call(_dw_kernel, h, w, rows, cfg, transpose_grid=True)
    return d_h, d_w, None


_tpu_logprobs.defvjp(_fwd, _bwd)
