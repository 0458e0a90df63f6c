"""Dot-product attention behind one function: XLA (CPU default), Pallas splash (TPU), cuDNN (GPU).

Masking is expressed once, for every backend, by segment ids and positions:
  key s is visible to query t  iff  seg_q[t] == seg_k[s] != 0  and (not causal or pos_k[s] <= pos_q[t]).
Segment id 0 marks padding; packed sequences use ids 1, 2, ...; vision uses one id per image/frame,
which gives the block-diagonal attention of the vision tower. A KV cache marks empty slots with 0.

`window` makes that block-diagonal structure cheap: when every segment is contiguous and at most
`window` long, a query's visible keys all lie within `window` positions of it, so attention over the
band |t - s| <= window is exact and costs O(T * window) instead of O(T^2). Splash skips the off-band
blocks (a LocalMask); XLA computes query chunks against the keys around them (`_xla_banded`).

Under a multi-device mesh, splash (a Mosaic kernel, which XLA cannot partition) runs per device inside
`jax.shard_map`, as MaxText does: batch over the mesh axes of logical "batch", heads over those of the
heads' logical name when both query and key/value heads divide by them; the sequence stays whole.
"""
from __future__ import annotations

import functools
import threading

import jax
import jax.numpy as jnp
from absl import logging
from jax.sharding import PartitionSpec

from rmsweb_jax.errors import UserError
from rmsweb_jax.models import sharding

_SPLASH_BLOCK = 128  # splash tiles the sequence in blocks of 128 (Mosaic's lane width)
_CAUSAL_CHUNK = 128  # smallest query chunk of the XLA path's block-causal split
_FALLBACKS_LOGGED: set[tuple] = set()  # (q shape, k shape, dtype, reason) already reported under "auto"
_FALLBACKS_LOCK = threading.Lock()


def attention(q: jax.Array, k: jax.Array, v: jax.Array, *, q_segment_ids: jax.Array, kv_segment_ids: jax.Array,
              causal: bool, q_positions: jax.Array | None = None, kv_positions: jax.Array | None = None,
              impl: str = "auto", scale: float | None = None, window: int | None = None, mesh=None,
              rules=sharding.DEFAULT_RULES, head_axes: tuple[str, str] = ("q_heads", "kv_heads")) -> jax.Array:
    """Returns softmax(q k^T * scale + mask) v, shape [B, T, H, D].

    q: [B, T, H, D]; k, v: [B, S, KVH, D] with H a multiple of KVH (grouped-query attention).
    Segment ids: int [B, T] / [B, S]. Positions (for `causal`): int [B, T] / [B, S]; default arange.
    window: the longest segment (self-attention in sequence order only); only keys within `window` of
    their query are computed. A row whose segments break that promise comes back all NaN rather than
    silently attending to part of its segment. None: every key.
    mesh, rules: the mesh splash runs on (one shard_map program per device) and the logical-axis rules
    that place batch and heads; head_axes: the logical names of the query and key/value heads.
    """
    b, t, h, d = q.shape
    s, kvh = k.shape[1], k.shape[2]
    if h % kvh:
        raise ValueError(f"attention: {h} query heads is not a multiple of {kvh} key/value heads")
    if k.shape != v.shape or k.shape[0] != b or k.shape[3] != d:
        raise ValueError(f"attention: q {q.shape}, k {k.shape}, v {v.shape} do not match [B,T,H,D]/[B,S,KVH,D]")
    scale = d ** -0.5 if scale is None else scale
    in_order = q_positions is None and kv_positions is None and t == s
    if causal:
        q_positions = jnp.broadcast_to(jnp.arange(t), (b, t)) if q_positions is None else q_positions
        kv_positions = jnp.broadcast_to(jnp.arange(s), (b, s)) if kv_positions is None else kv_positions
    if window is not None:
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise ValueError(f"attention: window must be a positive int (the longest segment), got {window!r}")
        if not in_order:
            raise ValueError(f"attention: window={window} needs self-attention in sequence order (T == S, no "
                             f"positions given), got q {tuple(q.shape)}, k {tuple(k.shape)}")
        out = _attention(q, k, v, q_segment_ids, kv_segment_ids, causal, q_positions, kv_positions, impl, scale,
                         window if window < t else None, in_order, mesh, rules, head_axes)
        broken = _segments_beyond(q_segment_ids, kv_segment_ids, window)  # [B]
        return jnp.where(broken[:, None, None, None], jnp.nan, out).astype(out.dtype)
    return _attention(q, k, v, q_segment_ids, kv_segment_ids, causal, q_positions, kv_positions, impl, scale, None,
                      in_order, mesh, rules, head_axes)


def _attention(q, k, v, q_seg, kv_seg, causal, q_pos, kv_pos, impl, scale, window, in_order, mesh, rules,
               head_axes):
    t = q.shape[1]
    requested, impl = impl, _resolve(impl, mesh)
    if impl in ("splash", "splash_interpret") and in_order:
        # "splash_interpret" runs the same Pallas kernel in interpret mode (tests on CPU).
        return _splash(q, k, v, q_seg, kv_seg, causal, scale, window, interpret=impl == "splash_interpret",
                       mesh=mesh, rules=rules, head_axes=head_axes)
    if window is not None and t > 3 * window:
        # cuDNN included: its dense mask would cost O(T^2) whatever the band; the banded XLA path is exact.
        return _xla_banded(q, k, v, q_seg, kv_seg, causal, window, scale)
    if impl == "cudnn" and t > 1:
        out = _cudnn(q, k, v, _mask(q_seg, kv_seg, causal, q_pos, kv_pos), scale, requested=requested)
        if out is not None:
            return out
    if causal and in_order and t >= 2 * _CAUSAL_CHUNK:
        return _xla_causal_chunked(q, k, v, q_seg, kv_seg, q_pos, kv_pos, scale)
    return _xla(q, k, v, q_seg, kv_seg, causal, q_pos, kv_pos, scale)


def _segments_beyond(q_seg, kv_seg, window: int) -> jax.Array:
    """Returns [B] bool: whether a row has a query and a key of one (non-padding) segment more than `window` apart.

    Segments are contiguous, so one longer than the window shows a pair exactly window + 1 apart.
    """
    gap = window + 1
    if q_seg.shape[1] <= gap:
        return jnp.zeros((q_seg.shape[0],), bool)
    ahead = (q_seg[:, :-gap] == kv_seg[:, gap:]) & (q_seg[:, :-gap] != 0)
    behind = (q_seg[:, gap:] == kv_seg[:, :-gap]) & (q_seg[:, gap:] != 0)
    return jnp.any(ahead | behind, axis=1)


def _xla_banded(q, k, v, q_seg, kv_seg, causal, window: int, scale):
    """Returns attention computed per query chunk of `window` rows against the 3 * window keys around it.

    Chunk i covers queries [i*W, (i+1)*W) and needs keys [i*W - W, (i+2)*W): one `dynamic_slice` of 3W
    keys (shifted inward at the ends). Keys of the slice outside the band are masked by segment ids as
    everywhere else, so the result equals the full path whenever segments are at most `window` long.
    Work: T * 3W logits instead of T^2.
    """
    b, t, h, d = q.shape
    c, span = window, 3 * window
    n = -(-t // c)
    pad = n * c - t
    if pad:
        # Padding rows carry segment id 0: invisible as keys, sliced off as queries.
        q, k, v = (jnp.pad(x, ((0, 0), (0, pad), (0, 0), (0, 0))) for x in (q, k, v))
        q_seg, kv_seg = (jnp.pad(x, ((0, 0), (0, pad))) for x in (q_seg, kv_seg))
    pos = jnp.broadcast_to(jnp.arange(n * c, dtype=jnp.int32), (b, n * c))
    starts = jnp.clip(jnp.arange(n) * c - window, 0, n * c - span)

    def chunk(qs, q_sg, q_ps, start):
        ks, vs, k_sg, k_ps = (jax.lax.dynamic_slice_in_dim(x, start, span, axis=1) for x in (k, v, kv_seg, pos))
        return _xla(qs, ks, vs, q_sg, k_sg, causal, q_ps, k_ps, scale)

    out = jax.vmap(chunk, in_axes=(1, 1, 1, 0))(q.reshape(b, n, c, h, d), q_seg.reshape(b, n, c),
                                                pos.reshape(b, n, c), starts)  # [n, B, C, H, D]
    return out.transpose(1, 0, 2, 3, 4).reshape(b, n * c, h, d)[:, :t]


def _xla_causal_chunked(q, k, v, q_seg, kv_seg, q_pos, kv_pos, scale, max_chunks: int = 4):
    """Returns causal attention computed per query chunk against only the keys it can see.

    With queries and keys in sequence order, query chunk i needs keys [0, (i+1)*chunk): computing
    chunk by chunk skips the upper-triangle blocks (4 chunks: 62.5% of the dense work), which
    matters on CPU where the softmax passes over [T, S] dominate attention time.
    """
    t = q.shape[1]
    chunks = max(c for c in range(1, max_chunks + 1) if t % c == 0 and t // c >= _CAUSAL_CHUNK)
    size = t // chunks
    outs = []
    for i in range(chunks):
        qs, ke = slice(i * size, (i + 1) * size), (i + 1) * size
        outs.append(_xla(q[:, qs], k[:, :ke], v[:, :ke], q_seg[:, qs], kv_seg[:, :ke], True, q_pos[:, qs],
                         kv_pos[:, :ke], scale))
    return jnp.concatenate(outs, axis=1)


def _cudnn(q, k, v, mask, scale, *, requested: str) -> jax.Array | None:
    """Returns cuDNN's attention, or None under "auto" when cuDNN refuses these inputs (logged once per shape).

    cuDNN refuses some inputs (fp32, head_dim > 128, no cuDNN at all). Asked for by name, that is an
    error; under "auto" the XLA path runs instead, which materialises [T, S] logits per head: it is
    slower and can run out of memory on long rows, so the fallback is reported rather than silent.
    """
    try:
        return jax.nn.dot_product_attention(q, k, v, mask=mask[:, None], scale=scale, implementation="cudnn")
    except (ValueError, RuntimeError, NotImplementedError) as err:  # jax's cuDNN checks raise these
        why = f"cuDNN attention refused q {tuple(q.shape)} k {tuple(k.shape)} {q.dtype}: {err}"
        if requested == "cudnn":
            raise UserError(f"config.model.attention_impl = 'cudnn': {why}. Use 'auto' (falls back to XLA) or "
                            "'xla', or inputs cuDNN takes (bfloat16/float16 compute, head_dim <= 128, a GPU with "
                            "cuDNN)") from err
        key = (tuple(q.shape), tuple(k.shape), str(q.dtype), str(err))
        with _FALLBACKS_LOCK:
            first = key not in _FALLBACKS_LOGGED
            _FALLBACKS_LOGGED.add(key)
        if first:
            logging.warning("attention_impl 'auto': %s; using the XLA path for this shape (slower; its [T, S] "
                            "logits can run out of memory on long rows)", why)
        return None


def _resolve(impl: str, mesh=None) -> str:
    """Returns the path "auto" takes: the platform of the mesh's devices (a program compiled ahead of time for a
    TPU slice on a CPU host takes splash), else of the default devices."""
    if impl != "auto":
        return impl
    platform = (jax.devices() if mesh is None else mesh.devices.flat)[0].platform
    return {"tpu": "splash", "gpu": "cudnn", "cuda": "cudnn"}.get(platform, "xla")


def _mask(q_seg, kv_seg, causal, q_pos, kv_pos) -> jax.Array:
    mask = (q_seg[:, :, None] == kv_seg[:, None, :]) & (kv_seg[:, None, :] != 0)
    if causal:
        mask &= kv_pos[:, None, :] <= q_pos[:, :, None]
    return mask  # [B, T, S]


def _xla(q, k, v, q_seg, kv_seg, causal, q_pos, kv_pos, scale):
    b, t, h, d = q.shape
    s, kvh = k.shape[1], k.shape[2]
    g = h // kvh
    # Heads-major layout [B, KVH, G*T, D] x [B, KVH, S, D]: two leading batch dims and one contracting
    # dim is the batched-GEMM form XLA:CPU runs fast (the [B,T,KVH,G,D] einsum was ~20x slower there).
    qh = q.reshape(b, t, kvh, g, d).transpose(0, 2, 3, 1, 4).reshape(b, kvh, g * t, d)
    kh, vh = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)
    logits = jnp.einsum("bkmd,bksd->bkms", qh, kh, preferred_element_type=jnp.float32) * scale
    mask = _mask(q_seg, kv_seg, causal, q_pos, kv_pos)  # [B, T, S]
    mask = jnp.broadcast_to(mask[:, None, None], (b, 1, g, t, s)).reshape(b, 1, g * t, s)
    # A finite floor (not -inf) keeps fully masked rows (padding queries) NaN-free in both passes.
    logits = jnp.where(mask, logits, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(logits, axis=-1).astype(v.dtype)
    out = jnp.einsum("bkms,bksd->bkmd", probs, vh)
    return out.reshape(b, kvh, g, t, d).transpose(0, 3, 1, 2, 4).reshape(b, t, h, d)


def _splash(q, k, v, q_seg, kv_seg, causal, scale, window, *, interpret: bool, mesh, rules, head_axes):
    """Returns splash attention, per device inside `jax.shard_map` when `mesh` has more than one device.

    Splash tiles the sequence in blocks of 128 (Mosaic's lane width), so T is padded up to a multiple
    of 128 with segment id 0, which no real query sees. Splash's own GQA (k [KVH, S, D]) reads each key
    head once for its H / KVH query heads.
    """
    b, t, h, d = q.shape
    pad = -t % _SPLASH_BLOCK
    if pad:
        q, k, v = (jnp.pad(x, ((0, 0), (0, pad), (0, 0), (0, 0))) for x in (q, k, v))
        q_seg, kv_seg = (jnp.pad(x, ((0, 0), (0, pad))) for x in (q_seg, kv_seg))
    q_seg, kv_seg = q_seg.astype(jnp.int32), kv_seg.astype(jnp.int32)
    local = functools.partial(_splash_local, causal=causal, scale=scale, window=window, interpret=interpret)
    # The kernel's dots take the MXU's own precision: under a global jax_default_matmul_precision='highest'
    # (set for exact CPU references) Mosaic refuses bf16 operands with an fp32 contract precision.
    with jax.default_matmul_precision("default"):
        if mesh is None or mesh.size == 1:
            out = local(q, k, v, q_seg, kv_seg)
        else:
            q_spec, kv_spec = _splash_specs(q.shape, k.shape, mesh, rules, head_axes)
            seg_spec = PartitionSpec(q_spec[0], None)
            # check_vma=False: pallas_call does not declare how its outputs vary over the mesh axes.
            out = jax.shard_map(local, mesh=mesh, in_specs=(q_spec, kv_spec, kv_spec, seg_spec, seg_spec),
                                out_specs=q_spec, check_vma=False)(q, k, v, q_seg, kv_seg)
    # Splash treats equal segment ids as visible, padding included; padded query rows are never read.
    return out[:, :t]


def _splash_specs(q_shape, k_shape, mesh, rules, head_axes) -> tuple[PartitionSpec, PartitionSpec]:
    """Returns (q spec, k/v spec) for splash's shard_map: batch as the rules say, heads only when both the
    query and the key/value heads divide over the same mesh axes, sequence and head_dim whole (the kernel
    sees every key of its rows)."""
    q_heads, kv_heads = head_axes
    qs = sharding.logical_to_spec(("batch", None, q_heads, None), rules, mesh, q_shape)
    ks = sharding.logical_to_spec(("batch", None, kv_heads, None), rules, mesh, k_shape)
    batch = qs[0] if qs[0] == ks[0] else None
    heads = qs[2] if qs[2] == ks[2] else None
    return PartitionSpec(batch, None, heads, None), PartitionSpec(batch, None, heads, None)


def _splash_local(q, k, v, q_seg, kv_seg, *, causal, scale, window, interpret):
    """Returns one device's splash attention [b, T, h, D] for its rows and heads (T a multiple of 128)."""
    # deferred: the TPU Pallas kernels load only where splash attention is chosen (never on CPU/GPU paths)
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm

    t, h = q.shape[1], q.shape[2]
    if window is not None:
        # A band, causal or not: splash skips every block of keys wholly outside it.
        base = sm.LocalMask((t, t), window_size=(window, 0 if causal else window), offset=0)
    else:
        base = sm.CausalMask((t, t)) if causal else sm.FullMask((t, t))
    kernel = sk.make_splash_mha(mask=sm.MultiHeadMask([base] * h), head_shards=1, q_seq_shards=1,
                                interpret=interpret)

    def one(qb, kb, vb, qs, ks):
        return kernel(qb * scale, kb, vb, segment_ids=sk.SegmentIds(q=qs, kv=ks))

    out = jax.vmap(one)(q.transpose(0, 2, 1, 3), k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3), q_seg, kv_seg)
    return out.transpose(0, 2, 1, 3)


# ---- shared-prefix (cascade) attention for group decoding ---------------------------------------------
# G rows decoding from one prompt attend to that prompt's keys once per group plus their own keys. Each part is
# a softmax over its keys, kept with its log-sum-exp; two parts combine exactly (FlashInfer's cascade attention,
# vLLM's prefix-shared decode): out = sum_i out_i * exp(lse_i - lse), lse = logaddexp(lse_a, lse_b).

def softmax_part(logits: jax.Array, visible: jax.Array, v: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Returns (softmax(logits) v [..., M, D], log-sum-exp [..., M] fp32) over the visible keys of one part.

    logits fp32 [..., M, S] (already scaled); visible bool, broadcastable to it; v [..., S, D]. A row with no
    visible key gets a log-sum-exp near the fp32 floor, so merging gives it no weight."""
    logits = jnp.where(visible, logits, jnp.finfo(jnp.float32).min)
    top = jnp.max(logits, axis=-1, keepdims=True)
    e = jnp.exp(logits - top)
    total = jnp.sum(e, axis=-1, keepdims=True)
    # Normalised after the product with v: M x D divisions instead of M x S.
    out = jnp.einsum("...ms,...sd->...md", e.astype(v.dtype), v, preferred_element_type=jnp.float32) / total
    return out.astype(v.dtype), (top + jnp.log(total))[..., 0]


def merge_parts(a: tuple[jax.Array, jax.Array], b: tuple[jax.Array, jax.Array]) -> jax.Array:
    """Returns the attention over the union of two parts' keys from each part's (out [..., M, D], lse [..., M])."""
    (out_a, lse_a), (out_b, lse_b) = a, b
    lse = jnp.logaddexp(lse_a, lse_b)
    w_a, w_b = jnp.exp(lse_a - lse)[..., None], jnp.exp(lse_b - lse)[..., None]
    return (out_a.astype(jnp.float32) * w_a + out_b.astype(jnp.float32) * w_b).astype(out_a.dtype)


def prefix_part(qh: jax.Array, prefix_kt: jax.Array, prefix_v: jax.Array, prefix_segment_ids: jax.Array,
                scale: float) -> tuple[jax.Array, jax.Array]:
    """Returns (out [B, KVH, M, D], lse [B, KVH, M]) of heads-major queries qh [B, KVH, M, D] over their group's
    shared prefix: keys prefix_kt [P, KVH, D, Sp] (key-minor), values prefix_v [P, KVH, Sp, D], rows
    b*G..b*G+G-1 sharing prefix row b (B = P*G).

    Every key of the prefix precedes every query, so a query sees all its non-padding keys (segment id != 0).
    The G rows' queries of one KV head form one [G*M, D] x [D, Sp] product: the prefix is read once per group, and
    keys stored [D, Sp] make it a plain matrix product (XLA:CPU ran the [Sp, D] form's transposed product ~1.3x
    slower in a decode step, bench/README.md)."""
    b, kvh, m, d = qh.shape
    p = prefix_kt.shape[0]
    if b % p:
        raise ValueError(f"prefix_part: {b} query rows are not a whole number of groups over {p} prefix rows")
    group = b // p
    qp = qh.reshape(p, group, kvh, m, d).transpose(0, 2, 1, 3, 4).reshape(p, kvh, group * m, d)
    logits = jnp.einsum("pkmd,pkds->pkms", qp, prefix_kt.astype(qh.dtype), preferred_element_type=jnp.float32)
    out, lse = softmax_part(logits * scale, (prefix_segment_ids != 0)[:, None, None, :], prefix_v.astype(qh.dtype))
    out = out.reshape(p, kvh, group, m, d).transpose(0, 2, 1, 3, 4).reshape(b, kvh, m, d)
    return out, lse.reshape(p, kvh, group, m).transpose(0, 2, 1, 3).reshape(b, kvh, m)


def prefix_shared_attention(q: jax.Array, k: jax.Array, v: jax.Array, prefix_k: jax.Array, prefix_v: jax.Array, *,
                            q_segment_ids: jax.Array, kv_segment_ids: jax.Array, prefix_segment_ids: jax.Array,
                            q_positions: jax.Array, kv_positions: jax.Array, scale: float | None = None) -> jax.Array:
    """Returns causal attention [B, T, H, D] of q over its group's shared prefix followed by its own keys.

    q [B, T, H, D]; k, v [B, S, KVH, D], the rows' own (suffix) cache, masked as `attention` masks (segment ids,
    causal by position); prefix_k, prefix_v [P, Sp, KVH, D] with B = P*G (rows prompt-major), prefix_segment_ids
    [P, Sp] (0 = padding). Equals `attention` over the concatenation [prefix ; own keys] up to summation order."""
    b, t, h, d = q.shape
    kvh = k.shape[2]
    g = h // kvh
    scale = d ** -0.5 if scale is None else scale
    qh = q.reshape(b, t, kvh, g, d).transpose(0, 2, 3, 1, 4).reshape(b, kvh, g * t, d)
    logits = jnp.einsum("bkmd,bksd->bkms", qh, k.transpose(0, 2, 1, 3), preferred_element_type=jnp.float32) * scale
    mask = _mask(q_segment_ids, kv_segment_ids, True, q_positions, kv_positions)  # [B, T, S]
    mask = jnp.broadcast_to(mask[:, None, None], (b, 1, g, t, mask.shape[-1])).reshape(b, 1, g * t, -1)
    own = softmax_part(logits, mask, v.transpose(0, 2, 1, 3))
    shared = prefix_part(qh, prefix_k.transpose(0, 2, 3, 1), prefix_v.transpose(0, 2, 1, 3), prefix_segment_ids,
                         scale)
    out = merge_parts(shared, own)
    return out.reshape(b, kvh, g, t, d).transpose(0, 3, 1, 2, 4).reshape(b, t, h, d)
