"""One-token decode steps over weights copied into a layout made for them (the CPU sampler's path).

A decode step multiplies a few rows (the batch) by every weight matrix once: its time is the time to
stream the weights from memory. Three things slow that stream on XLA:CPU with the training layout:
slicing each layer out of the stacked parameters inside the decode loop copies every layer's weights
on every step; XLA's dot kernels stream an [in, out] kernel at 5-10 GB/s here; and the stacked cache is
transposed to heads-major in every layer of every step.

So `step_weights` copies each layer's kernels out of the stack as [out, in] matrices (q/k/v fused into
one, gate/up into one; the Sampler makes this copy once per set of weights, again when a parameter
changes), and `step_cache` turns the prefill's stacked cache into one heads-major [B, KVH, S, hd] buffer per layer,
written in place in the decode loop. Each product of a few rows with an [out, in] matrix is then a
multiply fused into a row reduction, which XLA:CPU streams at 11-18 GB/s (`_rows_dot`).
`step_logits(step_hidden(...))` gives the stacked path's logits up to summation order (tested).

Cost: a second copy of the text weights, held by the Sampler. `RuntimeOptions.decode_layout` chooses:
"auto" uses it on a single CPU device when the copy is at most 2 GiB (2-3x faster steps on the bench
config; on TPU/GPU the compiler picks layouts itself and a second copy of an 8B model would not fit),
"stacked" never, "per_layer" always.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp

from rmsweb_jax.models.attention import merge_parts, prefix_part, softmax_part
from rmsweb_jax.models.qwen3_vl.layers import DTYPES, rms_norm
from rmsweb_jax.models.qwen3_vl.rope import apply_rope, mrope_cos_sin
from rmsweb_jax.models.qwen3_vl.text import LAYER_PARAMS, KVCache


_FUSED_GEMV = jax.__version_info__ >= (0, 10)
AUTO_MAX_COPY_BYTES = 2 << 30


class StepWeights(NamedTuple):
    """Text weights for decode steps: per-layer [out, in] matrices and the [V, D] output projection."""
    layers: tuple[dict[str, jax.Array], ...]  # qkv [(H+2KVH)*hd, D], o [D, H*hd], gate_up [2I, D], down [D, I], norms
    final_norm: jax.Array                     # [D]
    head: jax.Array                           # [V, D]


class StepCache(NamedTuple):
    """A KV cache with one heads-major buffer per layer: k[l], v[l] are [B, KVH, S, hd]."""
    k: tuple[jax.Array, ...]
    v: tuple[jax.Array, ...]
    segment_ids: jax.Array  # [B, S] int32, 0 = empty or padding
    index: jax.Array        # [] int32, next slot to write


def use_per_layer(model) -> bool:
    """Returns whether `model` decodes through this module (its runtime's decode_layout, resolved).

    "auto" picks it on a single CPU device when the copy takes at most AUTO_MAX_COPY_BYTES (a real 8B
    checkpoint loaded on a CPU host for debugging keeps the stacked path instead of doubling its memory).
    """
    layout = model.runtime.decode_layout
    if layout == "auto":
        device = jax.local_devices()[0] if model.mesh is None else model.mesh.devices.flat[0]
        one_device = model.mesh is None or model.mesh.size == 1
        return one_device and device.platform == "cpu" and copy_bytes(model.text) <= AUTO_MAX_COPY_BYTES
    return layout == "per_layer"


def copy_bytes(text) -> int:
    """Returns the bytes `step_weights` allocates for a TextDecoder (its weights in the compute dtype)."""
    n = sum(math.prod(getattr(text, name).shape) for name in LAYER_PARAMS if name.endswith("_kernel"))
    n += math.prod(text.embed.shape if text.lm_head is None else text.lm_head.shape)
    return n * jnp.dtype(DTYPES[text.runtime.compute_dtype]).itemsize


def step_weights(text) -> StepWeights:
    """Returns copies of a TextDecoder's weights in the decode-step layout (call inside the jitted program)."""
    cfg, dt = text.cfg, DTYPES[text.runtime.compute_dtype]

    def rows(kernel, n_in=1):  # [in..., out...] -> [out, in]
        return kernel.astype(dt).reshape(math.prod(kernel.shape[:n_in]), -1).T

    layers = []
    for i in range(cfg.num_hidden_layers):
        layers.append({
            "qkv": jnp.concatenate([rows(text.q_kernel[i]), rows(text.k_kernel[i]), rows(text.v_kernel[i])]),
            "o": rows(text.o_kernel[i], n_in=2),
            "gate_up": jnp.concatenate([rows(text.gate_kernel[i]), rows(text.up_kernel[i])]),
            "down": rows(text.down_kernel[i]),
            "input_norm": text.input_norm[i], "post_attention_norm": text.post_attention_norm[i],
            "q_norm": text.q_norm[i], "k_norm": text.k_norm[i],
        })
    head = text.embed[...].astype(dt) if text.lm_head is None else rows(text.lm_head[...])
    return StepWeights(tuple(layers), text.final_norm[...], head)


def step_cache(cache: KVCache) -> StepCache:
    """Returns the stacked [L, B, S, KVH, hd] cache as per-layer heads-major buffers."""
    k = tuple(cache.k[i].transpose(0, 2, 1, 3) for i in range(cache.k.shape[0]))
    v = tuple(cache.v[i].transpose(0, 2, 1, 3) for i in range(cache.v.shape[0]))
    return StepCache(k, v, cache.segment_ids, cache.index)


def _rows_dot(x: jax.Array, w: jax.Array) -> jax.Array:
    """Returns x [N, in] times w [out, in] transposed, as [N, out], accumulated in fp32.

    For 2-64 rows the product is written as a multiply fused into a row reduction over `in`: XLA:CPU
    streams w through that fusion at 11-18 GB/s on the bench machine against 5-10 GB/s through its dot
    kernels (measured in a decode-like loop: LM head [32000, 512] 5.7 vs 12.5 ms at 8 rows). For one row
    the dot's matrix-vector kernel is faster, and from ~64 rows on the GEMM is. The fusion is fast because
    XLA:CPU hands it to YNNPACK (jaxlib 0.10 here); older jaxlibs run it ~10x slower, so they keep the dot.
    """
    if _FUSED_GEMV and 2 <= x.shape[0] <= 64:
        prod = w.astype(jnp.float32)[:, None, :] * x.astype(jnp.float32)[None, :, :]  # fused, never stored
        return jnp.sum(prod, axis=-1).T.astype(x.dtype)
    y = jax.lax.dot_general(w, x.astype(w.dtype), (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)
    return y.T.astype(x.dtype)


def step_hidden(text, weights: StepWeights, cache: StepCache, tokens: jax.Array, position_ids: jax.Array,
                prefix: StepCache | None = None) -> tuple[jax.Array, StepCache]:
    """Returns (final-normed hidden [B, D], updated cache) for one new token per row.

    tokens [B] int32; position_ids [3, B, 1] (MRoPE t/h/w of the new token). Every row's new token
    has segment id 1, like the decode steps of the stacked path. `prefix`: a cache of P rows shared by
    groups of B / P rows (prompt-major), read once per group; `cache` then holds each row's own tokens.
    """
    cfg, dt = text.cfg, DTYPES[text.runtime.compute_dtype]
    b = tokens.shape[0]
    h, kvh, hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    g = h // kvh
    x = jnp.take(text.embed[...], tokens, axis=0).astype(dt)  # [B, D]
    cos, sin = mrope_cos_sin(position_ids, head_dim=hd, theta=cfg.rope_theta, mrope_section=cfg.mrope_section,
                             dtype=dt)
    index = cache.index
    seg = jax.lax.dynamic_update_slice(cache.segment_ids, jnp.ones((b, 1), jnp.int32), (0, index))
    visible = (seg == 1)[:, None, None, :]  # [B, 1, 1, S]: the written slots of the row's sequence (id 1)
    scale = hd ** -0.5
    ks, vs = list(cache.k), list(cache.v)
    for i, p in enumerate(weights.layers):
        y = rms_norm(x, p["input_norm"], cfg.rms_norm_eps)
        qkv = _rows_dot(y, p["qkv"])
        q = qkv[:, :h * hd].reshape(b, 1, h, hd)
        k = qkv[:, h * hd:(h + kvh) * hd].reshape(b, 1, kvh, hd)
        v = qkv[:, (h + kvh) * hd:].reshape(b, kvh, 1, hd)
        q = apply_rope(rms_norm(q, p["q_norm"], cfg.rms_norm_eps), cos, sin)
        k = apply_rope(rms_norm(k, p["k_norm"], cfg.rms_norm_eps), cos, sin)
        ks[i] = jax.lax.dynamic_update_slice(ks[i], k.reshape(b, kvh, 1, hd).astype(ks[i].dtype), (0, 0, index, 0))
        vs[i] = jax.lax.dynamic_update_slice(vs[i], v.astype(vs[i].dtype), (0, 0, index, 0))
        qh = q.reshape(b, kvh, g, hd)
        # Scores as a multiply-reduce over hd (XLA:CPU's batched dot costs ~5x more for these tiny products).
        prod = qh.astype(jnp.float32)[:, :, :, None, :] * ks[i].astype(jnp.float32)[:, :, None]
        logits = jnp.sum(prod, axis=-1) * scale
        if prefix is None:
            logits = jnp.where(visible, logits, jnp.finfo(jnp.float32).min)
            probs = jax.nn.softmax(logits, axis=-1).astype(dt)
            o = jnp.einsum("bkgs,bksd->bkgd", probs, vs[i].astype(dt)).reshape(b, h * hd)
        else:
            own = softmax_part(logits, visible, vs[i].astype(dt))
            shared = prefix_part(qh.astype(dt), prefix.k[i], prefix.v[i], prefix.segment_ids, scale)
            o = merge_parts(shared, own).reshape(b, h * hd)
        x = x + _rows_dot(o, p["o"])
        y = rms_norm(x, p["post_attention_norm"], cfg.rms_norm_eps)
        gate, up = jnp.split(_rows_dot(y, p["gate_up"]), 2, axis=-1)
        x = x + _rows_dot(jax.nn.silu(gate) * up, p["down"])
    x = rms_norm(x, weights.final_norm, cfg.rms_norm_eps)
    return x, StepCache(tuple(ks), tuple(vs), seg, index + 1)


def step_logits(weights: StepWeights, hidden: jax.Array) -> jax.Array:
    """Returns fp32 logits [B, V] from final hidden states [B, D]."""
    return _rows_dot(hidden.astype(jnp.float32), weights.head)
