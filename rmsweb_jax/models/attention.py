"""Dot-product attention behind one function: XLA (CPU default), Pallas splash (TPU), cuDNN (GPU).

Masking is expressed once, for every backend, by segment ids and positions:
  key s is visible to query t  iff  seg_q[t] == seg_k[s] != 0  and (not causal or pos_k[s] <= pos_q[t]).
Segment id 0 marks padding; packed sequences use ids 1, 2, ...; vision uses one id per image/frame,
which gives the block-diagonal attention of the vision tower. A KV cache marks empty slots with 0.
"""
from __future__ import annotations

import threading

import jax
import jax.numpy as jnp
from absl import logging

_SPLASH_BLOCK = 128  # splash tiles the sequence in blocks of 128 (Mosaic's lane width)
_CAUSAL_CHUNK = 128  # smallest query chunk of the XLA path's block-causal split
_FALLBACKS_LOGGED: set[tuple] = set()  # (q shape, k shape, dtype, reason) already reported under "auto"
_FALLBACKS_LOCK = threading.Lock()


def attention(q: jax.Array, k: jax.Array, v: jax.Array, *, q_segment_ids: jax.Array, kv_segment_ids: jax.Array,
              causal: bool, q_positions: jax.Array | None = None, kv_positions: jax.Array | None = None,
              impl: str = "auto", scale: float | None = None) -> jax.Array:
    """Returns softmax(q k^T * scale + mask) v, shape [B, T, H, D].

    q: [B, T, H, D]; k, v: [B, S, KVH, D] with H a multiple of KVH (grouped-query attention).
    Segment ids: int [B, T] / [B, S]. Positions (for `causal`): int [B, T] / [B, S]; default arange.
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
    requested, impl = impl, _resolve(impl)
    if impl in ("splash", "splash_interpret") and in_order and t % _SPLASH_BLOCK == 0:
        # "splash_interpret" runs the same Pallas kernel in interpret mode (tests on CPU).
        return _splash(q, k, v, q_segment_ids, kv_segment_ids, causal, scale, interpret=impl == "splash_interpret")
    if impl == "cudnn" and t > 1:
        mask = _mask(q_segment_ids, kv_segment_ids, causal, q_positions, kv_positions)
        out = _cudnn(q, k, v, mask, scale, requested=requested)
        if out is not None:
            return out
    if causal and in_order and t >= 2 * _CAUSAL_CHUNK:
        return _xla_causal_chunked(q, k, v, q_segment_ids, kv_segment_ids, q_positions, kv_positions, scale)
    return _xla(q, k, v, q_segment_ids, kv_segment_ids, causal, q_positions, kv_positions, scale)


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
            raise ValueError(f"config.model.attention_impl = 'cudnn': {why}. Use 'auto' (falls back to XLA) or "
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


def _resolve(impl: str) -> str:
    if impl != "auto":
        return impl
    platform = jax.devices()[0].platform
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


def _splash(q, k, v, q_seg, kv_seg, causal, scale, interpret: bool = False):
    # TPU only. Block sizes stay at 128 multiples to respect Mosaic's (8, 128) tiling.
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm

    b, t, h, d = q.shape
    kvh = k.shape[2]
    base = sm.CausalMask((t, t)) if causal else sm.FullMask((t, t))
    mask = sm.MultiHeadMask([base] * h)
    kernel = sk.make_splash_mha_single_device(mask=mask, interpret=interpret)
    # Repeat KV heads for MHA form; splash's GQA entry point varies across JAX versions.
    rep = h // kvh
    kk = jnp.repeat(k, rep, axis=2) if rep > 1 else k
    vv = jnp.repeat(v, rep, axis=2) if rep > 1 else v

    def one(qb, kb, vb, qs, ks):
        seg = sk.SegmentIds(q=qs, kv=ks)
        return kernel(qb * scale, kb, vb, segment_ids=seg)

    out = jax.vmap(one)(q.transpose(0, 2, 1, 3), kk.transpose(0, 2, 1, 3), vv.transpose(0, 2, 1, 3),
                        q_seg.astype(jnp.int32), kv_seg.astype(jnp.int32))
    # Splash treats equal segment ids as visible, padding included; padded query rows are never read.
    return out.transpose(0, 2, 1, 3)

