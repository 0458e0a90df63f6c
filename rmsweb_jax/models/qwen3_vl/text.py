"""Qwen3-VL text decoder: GQA with per-head q/k RMSNorm, interleaved MRoPE, SwiGLU, DeepStack.

Decoder layers are stacked on a leading `layers` axis and run by one `lax.scan` (optionally
rematerialized; `RuntimeOptions.scan_layers=False` runs the same body as a Python loop). The same
scan serves training (no cache), prefill and decode (static KV cache, written in place with
`dynamic_update_slice`).
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx
from jax.ad_checkpoint import checkpoint_name

from rmsweb_jax.models import sharding
from rmsweb_jax.models.attention import attention, prefix_shared_attention
from rmsweb_jax.models.qwen3_vl.config import RuntimeOptions, TextConfig
from rmsweb_jax.models.qwen3_vl.layers import DTYPES, dense, param, remat, rms_norm, run_layers, values
from rmsweb_jax.models.qwen3_vl.rope import apply_rope

LAYER_PARAMS = ("input_norm", "q_kernel", "k_kernel", "v_kernel", "o_kernel", "q_norm", "k_norm",
                "post_attention_norm", "gate_kernel", "up_kernel", "down_kernel")


class KVCache(NamedTuple):
    """A static KV cache: slots [0, index) are written; segment id 0 marks empty or padded slots."""
    k: jax.Array            # [L, B, S, KVH, hd]
    v: jax.Array            # [L, B, S, KVH, hd]
    segment_ids: jax.Array  # [B, S] int32
    index: jax.Array        # [] int32, next slot to write

    @classmethod
    def zeros(cls, cfg: TextConfig, batch: int, length: int, dtype=jnp.float32) -> "KVCache":
        shape = (cfg.num_hidden_layers, batch, length, cfg.num_key_value_heads, cfg.head_dim)
        return cls(jnp.zeros(shape, dtype), jnp.zeros(shape, dtype), jnp.zeros((batch, length), jnp.int32),
                   jnp.zeros((), jnp.int32))


class TextDecoder(nnx.Module):
    def __init__(self, cfg: TextConfig, runtime: RuntimeOptions, *, tie_word_embeddings: bool, rngs: nnx.Rngs,
                 mesh=None, rules=sharding.DEFAULT_RULES):
        self.cfg, self.runtime, self.mesh, self.rules = cfg, runtime, mesh, rules
        dt = DTYPES[runtime.param_dtype]
        d, i, n = cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers
        h, kvh, hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        std = cfg.initializer_range
        L = ("layers",)
        self.embed = param(rngs, (cfg.vocab_size, d), ("vocab", "embed"), std=std, dtype=dt)
        self.input_norm = param(rngs, (n, d), L + ("norm",), init="ones", dtype=dt)
        self.q_kernel = param(rngs, (n, d, h, hd), L + ("embed", "q_heads", "head_dim"), std=std, dtype=dt)
        self.k_kernel = param(rngs, (n, d, kvh, hd), L + ("embed", "kv_heads", "head_dim"), std=std, dtype=dt)
        self.v_kernel = param(rngs, (n, d, kvh, hd), L + ("embed", "kv_heads", "head_dim"), std=std, dtype=dt)
        self.o_kernel = param(rngs, (n, h, hd, d), L + ("q_heads", "head_dim", "embed"), std=std, dtype=dt)
        self.q_norm = param(rngs, (n, hd), L + ("norm",), init="ones", dtype=dt)
        self.k_norm = param(rngs, (n, hd), L + ("norm",), init="ones", dtype=dt)
        self.post_attention_norm = param(rngs, (n, d), L + ("norm",), init="ones", dtype=dt)
        self.gate_kernel = param(rngs, (n, d, i), L + ("embed", "mlp"), std=std, dtype=dt)
        self.up_kernel = param(rngs, (n, d, i), L + ("embed", "mlp"), std=std, dtype=dt)
        self.down_kernel = param(rngs, (n, i, d), L + ("mlp", "embed"), std=std, dtype=dt)
        self.final_norm = param(rngs, (d,), ("norm",), init="ones", dtype=dt)
        self.lm_head = None if tie_word_embeddings else param(rngs, (d, cfg.vocab_size), ("embed", "vocab"),
                                                              std=std, dtype=dt)

    def embed_tokens(self, input_ids: jax.Array) -> jax.Array:
        """Returns token embeddings [B, T, D] in the compute dtype."""
        dt = DTYPES[self.runtime.compute_dtype]
        x = jnp.take(self.embed[...], input_ids, axis=0).astype(dt)
        return sharding.constrain(x, ("batch", "seq", "embed"), self.mesh, self.rules)

    def lm_head_matrix(self) -> jax.Array:
        """Returns the [D, V] output projection (the transposed embedding when tied)."""
        return self.embed[...].T if self.lm_head is None else self.lm_head[...]

    def logits(self, hidden: jax.Array) -> jax.Array:
        """Returns fp32 logits [B, T, V] from final hidden states."""
        dt = hidden.dtype
        out = dense(hidden, self.lm_head_matrix().astype(dt)).astype(jnp.float32)
        return sharding.constrain(out, ("batch", "seq", "vocab"), self.mesh, self.rules)

    def __call__(self, x: jax.Array, *, segment_ids: jax.Array, cos: jax.Array, sin: jax.Array,
                 visual_mask: jax.Array | None = None, visual_index: jax.Array | None = None,
                 deepstack: jax.Array | None = None, cache: KVCache | None = None, prefix: KVCache | None = None
                 ) -> tuple[jax.Array, KVCache | None]:
        """Returns (final-normed hidden [B, T, D], updated cache) for input embeddings x [B, T, D].

        segment_ids [B, T]: 0 = padding, packed sequences 1, 2, ...; cos/sin [B, T, hd] from MRoPE.
        deepstack [n_ds, Nv, D] is added after layers 0..n_ds-1 at the visual positions, gathered by
        `visual_index` (index of each position's visual token, valid where `visual_mask`).
        """
        cfg, dt = self.cfg, DTYPES[self.runtime.compute_dtype]
        b, t, _ = x.shape
        n_ds = 0 if deepstack is None else deepstack.shape[0]
        if cache is not None:
            index = cache.index
            kv_seg = jax.lax.dynamic_update_slice(cache.segment_ids, segment_ids.astype(jnp.int32), (0, index))
            q_pos = jnp.broadcast_to(index + jnp.arange(t, dtype=jnp.int32), (b, t))
            kv_pos = jnp.broadcast_to(jnp.arange(cache.k.shape[2], dtype=jnp.int32), (b, cache.k.shape[2]))
        else:
            kv_seg, q_pos, kv_pos = segment_ids, None, None

        def layer(h, xs):
            p, i, ck, cv, pk, pv = xs
            y = rms_norm(h, p["input_norm"], cfg.rms_norm_eps)
            q = dense(y, p["q_kernel"].astype(dt))
            k = dense(y, p["k_kernel"].astype(dt))
            v = dense(y, p["v_kernel"].astype(dt))
            q = apply_rope(rms_norm(q, p["q_norm"], cfg.rms_norm_eps), cos, sin)
            k = apply_rope(rms_norm(k, p["k_norm"], cfg.rms_norm_eps), cos, sin)
            q = sharding.constrain(q, ("batch", "seq", "q_heads", "head_dim"), self.mesh, self.rules)
            new_kv = (k, v)
            if ck is not None:
                # This layer's cache slice arrives as a scan input and the new entries leave as scan
                # outputs; the cache itself is written once after the scan (in place inside the
                # decode while_loop) instead of being threaded through the scan carry.
                k = jax.lax.dynamic_update_slice(ck, k.astype(ck.dtype), (0, index, 0, 0)).astype(dt)
                v = jax.lax.dynamic_update_slice(cv, v.astype(cv.dtype), (0, index, 0, 0)).astype(dt)
            if pk is not None:
                o = prefix_shared_attention(q, k, v, pk.astype(dt), pv.astype(dt), q_segment_ids=segment_ids,
                                            kv_segment_ids=kv_seg, prefix_segment_ids=prefix.segment_ids,
                                            q_positions=q_pos, kv_positions=kv_pos)
            else:
                o = attention(q, k, v, q_segment_ids=segment_ids, kv_segment_ids=kv_seg, causal=True,
                              q_positions=q_pos, kv_positions=kv_pos, impl=self.runtime.attention_impl,
                              mesh=self.mesh, rules=self.rules)
            o = checkpoint_name(o, "attention_out")
            h = h + dense(o, p["o_kernel"].astype(dt), n_in=2)
            y = rms_norm(h, p["post_attention_norm"], cfg.rms_norm_eps)
            gate = dense(y, p["gate_kernel"].astype(dt))
            up = dense(y, p["up_kernel"].astype(dt))
            h = h + dense(jax.nn.silu(gate) * up, p["down_kernel"].astype(dt))
            if n_ds:
                feats = jax.lax.dynamic_index_in_dim(deepstack, jnp.minimum(i, n_ds - 1), axis=0, keepdims=False)
                add = jnp.take(feats, visual_index, axis=0).astype(h.dtype)
                h = h + jnp.where((visual_mask & (i < n_ds))[..., None], add, 0)
            h = sharding.constrain(h, ("batch", "seq", "embed"), self.mesh, self.rules)
            return h, (new_kv if ck is not None else None)

        body = remat(layer, self.runtime.remat_policy)
        ck, cv = (cache.k, cache.v) if cache is not None else (None, None)
        pk, pv = (prefix.k, prefix.v) if prefix is not None else (None, None)
        xs = (values(self, LAYER_PARAMS), jnp.arange(cfg.num_hidden_layers, dtype=jnp.int32), ck, cv, pk, pv)
        x, new_kv = run_layers(body, x, xs, scan=self.runtime.scan_layers)
        x = rms_norm(x, self.final_norm[...], cfg.rms_norm_eps)
        if cache is None:
            return x, None
        nk, nv = new_kv  # [L, B, T, KVH, hd]
        k_all = jax.lax.dynamic_update_slice(cache.k, nk.astype(cache.k.dtype), (0, 0, index, 0, 0))
        v_all = jax.lax.dynamic_update_slice(cache.v, nv.astype(cache.v.dtype), (0, 0, index, 0, 0))
        return x, KVCache(k_all, v_all, kv_seg, cache.index + t)
