"""One-token decode steps over weights copied into a layout made for them (the CPU sampler's path).

A decode step multiplies a few rows (the batch) by every weight matrix once: its time is the time to
stream the weights from memory. Three things slow that stream on XLA:CPU with the training layout:
slicing each layer out of the stacked parameters inside the decode loop copies every layer's weights
on every step; on some hosts XLA's dot kernels stream a few rows' products slowly; and the stacked cache is
transposed to heads-major in every layer of every step.

So `step_weights` copies each layer's kernels out of the stack as 2-D matrices (q/k/v fused into one,
gate/up into one; the Sampler makes this copy once per set of weights, again when a parameter changes), and
`step_cache` turns the prefill's stacked cache into one heads-major [B, KVH, S, hd] buffer per layer, written in
place in the decode loop. How a few rows are multiplied by those matrices, and so their layout, depends on the
host (`_rows_dot`; `fused_rows_default` says which and why).
`step_logits(step_hidden(...))` gives the stacked path's logits up to summation order (tested).

Cost: a second copy of the text weights, held by the Sampler. `RuntimeOptions.decode_layout` chooses:
"auto" uses it on a single CPU device when the copy is at most 2 GiB (2-3x faster steps on the bench
config; on TPU/GPU the compiler picks layouts itself and a second copy of an 8B model would not fit),
"stacked" never, "per_layer" always.
"""
from __future__ import annotations

import dataclasses
import functools
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


@functools.partial(jax.tree_util.register_dataclass, data_fields=["layers", "final_norm", "head"],
                   meta_fields=["fused_rows"])
@dataclasses.dataclass(frozen=True)
class StepWeights:
    """Text weights for decode steps: per-layer matrices and the output projection, [out, in] when `fused_rows`
    (products of a few rows run as a multiply fused into a row reduction), else [in, out] (XLA's dot)."""
    layers: tuple[dict[str, jax.Array], ...]  # qkv [(H+2KVH)*hd, D], o [D, H*hd], gate_up [2I, D], down [D, I], norms
    final_norm: jax.Array                     # [D]
    head: jax.Array                           # [V, D]
    fused_rows: bool = False                  # static: the layout and the product `_rows_dot` runs


class StepCache(NamedTuple):
    """A KV cache with one heads-major buffer per layer: k[l], v[l] are [B, KVH, S, hd] (`step_cache`); a shared
    prefix's keys are key-minor, [P, KVH, hd, S] (`prefix_cache`)."""
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


@functools.cache
def fused_rows_default() -> bool:
    """Returns whether this host multiplies a few rows by a matrix faster as a fused multiply-reduce than as XLA's dot.

    Measured with jaxlib 0.10.2 in decode loops at 8 rows (bench/decode_split.py, bench/README.md): on the 2-core
    AMD EPYC with AVX-512 the dot over [in, out] streams the LM head [32000, 512] in 3.5 ms against the fused
    product's 10.7 (the text layers take the same time either way); on the AVX2 EPYC of earlier sessions the fused
    product was ~2x faster (5.7 against 12.5 ms). So the fused product is kept where AVX2 is present and AVX-512 is
    not, on jaxlib 0.10 and newer (older jaxlibs run it ~10x slower). Not measured: other AVX-512 CPUs, ARM hosts
    (they take the dot)."""
    if not _FUSED_GEMV:
        return False
    try:
        with open("/proc/cpuinfo") as f:
            flags = f.read()
    except OSError:  # not Linux: the dot
        return False
    return " avx2" in flags and " avx512f" not in flags


def step_weights(text, fused_rows: bool | None = None) -> StepWeights:
    """Returns copies of a TextDecoder's weights in the decode-step layout (call inside the jitted program).
    `fused_rows`: the layout and product (StepWeights); None: this host's faster one (fused_rows_default)."""
    cfg, dt = text.cfg, DTYPES[text.runtime.compute_dtype]
    fused_rows = fused_rows_default() if fused_rows is None else fused_rows

    def rows(*kernels, n_in=1):  # [in..., out...] each -> one [in, sum of outs], as [out, in] for the fused product
        matrix = jnp.concatenate([k.astype(dt).reshape(math.prod(k.shape[:n_in]), -1) for k in kernels], axis=1)
        return matrix.T if fused_rows else matrix

    layers = []
    for i in range(cfg.num_hidden_layers):
        layers.append({
            "qkv": rows(text.q_kernel[i], text.k_kernel[i], text.v_kernel[i]),
            "o": rows(text.o_kernel[i], n_in=2),
            "gate_up": rows(text.gate_kernel[i], text.up_kernel[i]),
            "down": rows(text.down_kernel[i]),
            "input_norm": text.input_norm[i], "post_attention_norm": text.post_attention_norm[i],
            "q_norm": text.q_norm[i], "k_norm": text.k_norm[i],
        })
    head = rows(text.embed[...].T if text.lm_head is None else text.lm_head[...])  # tied: the embedding [V, D]
    return StepWeights(tuple(layers), text.final_norm[...], head, fused_rows)


def step_cache(cache: KVCache) -> StepCache:
    """Returns the stacked [L, B, S, KVH, hd] cache as per-layer heads-major buffers."""
    return _per_layer(cache, key_axes=(0, 2, 1, 3))


def prefix_cache(cache: KVCache) -> StepCache:
    """Returns a prompt's stacked cache as the shared prefix of group decoding (`step_hidden`'s `prefix`): per-layer
    keys key-minor [P, KVH, hd, S], the layout `prefix_part` multiplies without a transpose, values [P, KVH, S, hd].
    Read-only in the decode loop, so the transposes run once per call."""
    return _per_layer(cache, key_axes=(0, 2, 3, 1))


def _per_layer(cache: KVCache, key_axes: tuple[int, ...]) -> StepCache:
    """Returns the stacked cache as one buffer per layer: keys [B, S, KVH, hd] transposed to `key_axes`, values
    heads-major [B, KVH, S, hd]."""
    k = tuple(cache.k[i].transpose(key_axes) for i in range(cache.k.shape[0]))
    v = tuple(cache.v[i].transpose(0, 2, 1, 3) for i in range(cache.v.shape[0]))
    return StepCache(k, v, cache.segment_ids, cache.index)


def _rows_dot(x: jax.Array, w: jax.Array, fused_rows: bool) -> jax.Array:
    """Returns x [N, in] times w, as [N, out], accumulated in fp32: w is [out, in] when `fused_rows`, else [in, out].

    With `fused_rows` and 2-64 rows the product is written as a multiply fused into a row reduction over `in`,
    which XLA:CPU hands to YNNPACK; for one row the dot's matrix-vector kernel is faster, and from ~64 rows on
    the GEMM is. Which of the two layouts is faster depends on the host: fused_rows_default.
    """
    if not fused_rows:
        return jnp.dot(x.astype(w.dtype), w, preferred_element_type=jnp.float32).astype(x.dtype)
    if 2 <= x.shape[0] <= 64:
        prod = w.astype(jnp.float32)[:, None, :] * x.astype(jnp.float32)[None, :, :]  # fused, never stored
        return jnp.sum(prod, axis=-1).T.astype(x.dtype)
    y = jax.lax.dot_general(w, x.astype(w.dtype), (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)
    return y.T.astype(x.dtype)


def step_hidden(text, weights: StepWeights, cache: StepCache, tokens: jax.Array, position_ids: jax.Array,
                prefix: StepCache | None = None) -> tuple[jax.Array, StepCache]:
    """Returns (final-normed hidden [B, D], updated cache) for one new token per row.

    tokens [B] int32; position_ids [3, B, 1] (MRoPE t/h/w of the new token). Every row's new token
    has segment id 1, like the decode steps of the stacked path. `prefix`: a cache of P rows shared by
    groups of B / P rows (prompt-major, laid out by `prefix_cache`), read once per group; `cache` then holds each
    row's own tokens.
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
        qkv = _rows_dot(y, p["qkv"], weights.fused_rows)
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
        x = x + _rows_dot(o, p["o"], weights.fused_rows)
        y = rms_norm(x, p["post_attention_norm"], cfg.rms_norm_eps)
        gate, up = jnp.split(_rows_dot(y, p["gate_up"], weights.fused_rows), 2, axis=-1)
        x = x + _rows_dot(jax.nn.silu(gate) * up, p["down"], weights.fused_rows)
    x = rms_norm(x, weights.final_norm, cfg.rms_norm_eps)
    return x, StepCache(tuple(ks), tuple(vs), seg, index + 1)


def step_logits(weights: StepWeights, hidden: jax.Array) -> jax.Array:
    """Returns fp32 logits [B, V] from final hidden states [B, D]."""
    return _rows_dot(hidden.astype(jnp.float32), weights.head, weights.fused_rows)
