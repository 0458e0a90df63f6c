"""Token log-probs on a device mesh: W all-gathered once a microbatch, bf16 matmuls, f32 statistics.

Left to XLA's SPMD partitioner, the chunked path (token_logprobs_chunked) gathers W inside its
loops: compiled for a v5p 2x2x1 mesh at 8B widths (D 4,096, V 151,936, W over ('fsdp', 'tensor'))
each of the 74 vocabulary chunks all-gathers the device's D-shard across the whole vocabulary
and the chunk across D, twice a chunk forward and three times backward (the dW buffer too):
some 370 gathers a microbatch, and every device runs every chunk, so the vocabulary's 'tensor'
sharding saves no work. Its dots are also written in float32 (that path widens bf16 for XLA:CPU).
Here the per-device program is written out with `jax.shard_map`:

  forward   W's local shard [D/e, V/v] is all-gathered over the mesh axes that shard its embed
            dim ("embed axes", e.g. 'fsdp') once, to [D, V/v]; the vocabulary shard stays local.
            A lax loop over chunks of it computes logit tiles h @ W_chunk in the inputs' dtype
            with float32 accumulation and merges their log-sum-exp statistics
            (kernels._logit_tiles); one pmax and one psum over the axes that shard the vocabulary
            ("vocab axes", e.g. 'tensor') combine the shards. Each shard sees the target logit
            only where target - axis_index * V/v falls in its columns, so the psum of the hits
            is the target logit.
  backward  each chunk's logits are recomputed from the gathered W, kept as a residual of the
            forward rather than gathered again. The loss forward is the last op of a model's
            forward and its backward the first of the backward pass, so nothing runs between
            them: the gathered W is alive during the loss backward either way, and keeping it
            costs no peak memory while saving a gather of the same bytes. Compiled for a v5p
            2x2x1 at 8B widths the two choices measured 1.866 GB (kept) and 1.870 GB
            (re-gathered, behind an optimization barrier so XLA could not merge the gathers)
            of temporaries. dh accumulates in float32 and is psum'd over the vocab axes; dW
            chunks are written into a local [D, V/v] buffer (W's dtype), then psum_scatter'd
            over the embed axes back to W's sharding and psum'd over the other axes that shard
            the rows.

The custom_vjp sits outside the two shard_maps, so nothing inside them is differentiated and
every collective above is written here, not derived by shard_map's transpose rule.

Layouts: rows (the leading dims of hidden and targets) may be sharded over any mesh axes except
the vocab axes, whose devices must hold the same rows (a ValueError says so otherwise); hidden's
feature dim is used whole (a sharded one is gathered by shard_map at the boundary). When rows
are replicated over an embed axis, each of its devices computes the same dW contribution, so
the reduce-scatter's sum is divided by that replication (exact for power-of-two meshes). Mesh
axes of size 1 are ignored; W replicated (no embed or vocab axes) and rows replicated both work.
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import Mesh, PartitionSpec as P

from kernels import _logit_tiles as tiles
from kernels.token_logprobs_chunked import DEFAULT_BLOCK_V

f32 = jnp.float32


class _Layout(NamedTuple):
    """How the arrays lie on the mesh, as the per-device programs need it (hashable: static)."""

    mesh: Mesh
    rows: P             # spec of the leading dims of hidden and targets (and of logp)
    lm_head: P          # spec of W [D, V]
    embed_axes: tuple   # mesh axes (size > 1) sharding W's D dim, in the spec's order
    vocab_axes: tuple   # mesh axes (size > 1) sharding W's V dim
    row_sum_axes: tuple  # axes sharding the rows but not W's D dim: dW is psum'd over them
    replicated_rows: int  # devices on the embed axes that hold the same rows (dW is divided by it)


@functools.partial(jax.jit, static_argnames=("mesh", "hidden_spec", "lm_head_spec", "temperature",
                                             "return_entropy", "block_v"))
def token_logprobs_sharded(hidden, lm_head, targets, *, mesh: Mesh, hidden_spec: P, lm_head_spec: P,
                           temperature: float = 1.0, return_entropy: bool = False,
                           block_v: int = DEFAULT_BLOCK_V):
    """Returns (logp [...], entropy [...] or None), float32, laid out like hidden's rows.

    hidden [..., D] and lm_head [D, V] as kernels.token_logprobs takes them, with the
    PartitionSpecs they have (or should have) on `mesh`: hidden_spec covers hidden's dims (its
    last entry, the feature dim, is ignored: see the module docstring), lm_head_spec W's two.
    targets [...] share hidden's leading dims and their sharding.
    """
    layout = _layout(mesh, hidden_spec, lm_head_spec, hidden.shape, lm_head.shape)
    out = _sharded(hidden, lm_head, targets, layout, 1.0 / float(temperature), int(block_v),
                   bool(return_entropy))
    return out[0], (out[1] if return_entropy else None)


def _axes(entry) -> tuple:
    """Returns the mesh axes of one PartitionSpec entry (None, a name, or a tuple of names)."""
    if entry is None:
        return ()
    return (entry,) if isinstance(entry, str) else tuple(entry)


def _layout(mesh, hidden_spec, lm_head_spec, hidden_shape, lm_head_shape) -> _Layout:
    """Returns the _Layout for the specs, or raises ValueError naming the spec at fault."""
    if len(hidden_spec) > len(hidden_shape):
        raise ValueError(f"hidden_spec {hidden_spec} has more entries than hidden {hidden_shape} has dims")
    if len(lm_head_spec) > 2:
        raise ValueError(f"lm_head_spec {lm_head_spec} must have at most 2 entries (lm_head is [D, V])")
    lead = len(hidden_shape) - 1
    row_entries = tuple(hidden_spec)[:lead] + (None,) * max(0, lead - len(hidden_spec))
    embed_entry, vocab_entry = (tuple(lm_head_spec) + (None, None))[:2]
    for name, spec in (("hidden_spec", hidden_spec), ("lm_head_spec", lm_head_spec)):
        unknown = [a for e in spec for a in _axes(e) if a not in mesh.shape]
        if unknown:
            raise ValueError(f"{name} {spec} names mesh axes {unknown} not in the mesh {dict(mesh.shape)}")
    for dim, (entry, size) in enumerate(zip(row_entries + (embed_entry, vocab_entry),
                                            tuple(hidden_shape[:lead]) + tuple(lm_head_shape))):
        shards = int(np.prod([mesh.shape[a] for a in _axes(entry)]))
        if size % shards:
            what = f"hidden dim {dim}" if dim < lead else ("lm_head's D", "lm_head's V")[dim - lead]
            raise ValueError(f"{what} = {size} is not divisible by the {shards} shards of mesh axes "
                             f"{_axes(entry)} (hidden_spec {hidden_spec}, lm_head_spec {lm_head_spec})")
    live = lambda axes: tuple(a for a in axes if mesh.shape[a] > 1)  # size-1 axes need no collective
    row_axes = live(a for e in row_entries for a in _axes(e))
    embed_axes, vocab_axes = live(_axes(embed_entry)), live(_axes(vocab_entry))
    if set(row_axes) & set(vocab_axes):
        raise ValueError(f"hidden_spec {hidden_spec} shards rows over {sorted(set(row_axes) & set(vocab_axes))}, "
                         f"which also shard lm_head's vocabulary (lm_head_spec {lm_head_spec}): the devices "
                         "holding one row must hold every vocabulary shard")
    replicated = int(np.prod([mesh.shape[a] for a in embed_axes if a not in row_axes]))
    return _Layout(mesh, P(*row_entries), P(embed_entry, vocab_entry), embed_axes, vocab_axes,
                   tuple(a for a in row_axes if a not in embed_axes), replicated)


def _shard_map(fn, layout: _Layout, in_specs, out_specs):
    # check_vma=False: the outputs' replication over the vocab axes comes from psum/pmax, which
    # the varying-axes checker cannot see through a custom loop; nothing here is differentiated.
    return jax.shard_map(fn, mesh=layout.mesh, in_specs=in_specs, out_specs=out_specs, check_vma=False)


def _gather_w(w_local, layout: _Layout):
    """Returns this device's vocabulary shard of W, whole along D: [D, V/v] in W's dtype."""
    if not layout.embed_axes:
        return w_local
    return lax.all_gather(w_local, layout.embed_axes, axis=0, tiled=True)


def _vocab_offset(layout: _Layout, width: int):
    """Returns the global id of this device's first vocabulary column."""
    if not layout.vocab_axes:
        return 0
    return lax.axis_index(layout.vocab_axes) * width


def _over_chunks(w, block_v: int, step, carry):
    """Returns carry after step(carry, w_chunk, v0) over W's column chunks.

    The full chunks run in a lax loop; a vocabulary that is not a multiple of the chunk ends
    with one static tail chunk, so W is never padded (padding would copy all of it).
    """
    bv = min(block_v, w.shape[1])
    n_full, tail = divmod(w.shape[1], bv)
    carry = lax.fori_loop(0, n_full, lambda i, c: step(c, lax.dynamic_slice_in_dim(w, i * bv, bv, 1), i * bv),
                          carry)
    return step(carry, w[:, n_full * bv:], n_full * bv) if tail else carry


def _chunk_logits(h, w_chunk, cols0, y, inv_t):
    """Returns (logits [T, bv] * inv_t in float32, target_hit [T, bv]) for columns from cols0."""
    z = jnp.dot(h, w_chunk.astype(h.dtype), preferred_element_type=f32) * inv_t
    cols = lax.broadcasted_iota(jnp.int32, (1, z.shape[1]), 1) + cols0
    return z, cols == y[:, None]


def _combine(st: tiles.RowStats, axes) -> tiles.RowStats:
    """Returns the statistics of all vocabulary shards from this shard's (a log-sum-exp merge)."""
    if not axes:
        return st
    m = lax.pmax(st.m, axes)
    d = st.m - m  # <= 0, finite
    c = jnp.exp(d)
    s, a, tgt = lax.psum((st.s * c, c * (st.a + st.s * d), st.tgt), axes)
    return tiles.RowStats(m, s, a, tgt)


def _forward_local(h, w, y, *, layout, inv_t, block_v, with_entropy):
    dtype = jnp.result_type(h.dtype, w.dtype)
    lead = y.shape
    h = h.reshape(-1, h.shape[-1]).astype(dtype)
    y = y.reshape(-1).astype(jnp.int32)
    w = _gather_w(w, layout)
    base = _vocab_offset(layout, w.shape[1])

    def step(stats, w_chunk, v0):
        z, hit = _chunk_logits(h, w_chunk, base + v0, y, inv_t)
        return tiles.merge(stats, tiles.tile_stats(z, hit, with_entropy))

    stats = _combine(_over_chunks(w, block_v, step, tiles.empty_stats(h.shape[0])), layout.vocab_axes)
    logp, lse, ent = (x.reshape(lead) for x in tiles.finalize(stats))
    return logp, lse, ent, w


def _backward_local(h, w, y, lse, g_logp, *entropy_terms, layout, inv_t, block_v):
    """Returns this device's (dh, dW shard) from its gathered W [D, V/v] (the forward's residual).

    entropy_terms: (entropy, its cotangent), or () when entropy was not asked for.
    """
    ent, g_ent = entropy_terms or (None, None)
    dtype, h_shape = jnp.result_type(h.dtype, w.dtype), h.shape
    h = h.reshape(-1, h.shape[-1]).astype(dtype)
    y = y.reshape(-1).astype(jnp.int32)
    col = lambda x: None if x is None else x.reshape(-1, 1)
    lse, ent, g_logp, g_ent = col(lse), col(ent), col(g_logp), col(g_ent)
    base = _vocab_offset(layout, w.shape[1])

    def step(carry, w_chunk, v0):
        d_h, d_w = carry
        z, hit = _chunk_logits(h, w_chunk, base + v0, y, inv_t)
        # dz in the matmul dtype, as the Pallas kernels do: bf16 operands, float32 accumulation.
        dz = tiles.logit_cotangent(z, hit, lse, ent, g_logp, g_ent, inv_t).astype(dtype)
        d_h = d_h + lax.dot_general(dz, w_chunk.astype(dtype), (((1,), (1,)), ((), ())),
                                    preferred_element_type=f32)
        dw_chunk = lax.dot_general(h, dz, (((0,), (0,)), ((), ())), preferred_element_type=f32)
        return d_h, lax.dynamic_update_slice_in_dim(d_w, dw_chunk.astype(w.dtype), v0, axis=1)

    init = (jnp.zeros(h.shape, f32), jnp.zeros(w.shape, w.dtype))
    d_h, d_w = _over_chunks(w, block_v, step, init)
    if layout.vocab_axes:
        d_h = lax.psum(d_h, layout.vocab_axes)
    if layout.embed_axes:
        d_w = lax.psum_scatter(d_w, layout.embed_axes, scatter_dimension=0, tiled=True)
    if layout.row_sum_axes:
        d_w = lax.psum(d_w, layout.row_sum_axes)
    if layout.replicated_rows > 1:
        d_w = d_w / layout.replicated_rows
    return d_h.reshape(h_shape), d_w


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5, 6))
def _sharded(h, w, y, layout, inv_t, block_v, with_entropy):
    return _forward(h, w, y, layout, inv_t, block_v, with_entropy)[0]


def _gathered_spec(layout: _Layout) -> P:
    """Returns the spec of the gathered W: whole along D, still sharded along V."""
    return P(None, layout.lm_head[1])


def _forward(h, w, y, layout, inv_t, block_v, with_entropy):
    hidden_spec = P(*layout.rows, None)
    fn = functools.partial(_forward_local, layout=layout, inv_t=inv_t, block_v=block_v,
                           with_entropy=with_entropy)
    logp, lse, ent, w_gathered = _shard_map(fn, layout, (hidden_spec, layout.lm_head, layout.rows),
                                            (layout.rows,) * 3 + (_gathered_spec(layout),))(h, w, y)
    outs = (logp, ent) if with_entropy else (logp,)
    return outs, (h, w_gathered, y, lse, ent if with_entropy else None)


def _backward(layout, inv_t, block_v, with_entropy, residuals, cotangents):
    h, w_gathered, y, lse, ent = residuals
    hidden_spec = P(*layout.rows, None)
    args = (h, w_gathered, y, lse, cotangents[0]) + ((ent, cotangents[1]) if with_entropy else ())
    fn = functools.partial(_backward_local, layout=layout, inv_t=inv_t, block_v=block_v)
    in_specs = (hidden_spec, _gathered_spec(layout)) + (layout.rows,) * (len(args) - 2)
    d_h, d_w = _shard_map(fn, layout, in_specs, (hidden_spec, layout.lm_head))(*args)
    return d_h.astype(h.dtype), d_w, None


_sharded.defvjp(_forward, _backward)
