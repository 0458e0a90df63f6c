"""Qwen3-VL vision tower: patch embed, interpolated learned positions, 2D RoPE blocks, mergers.

Blocks are stacked along a leading `layers` axis and run with one `lax.scan`, so compile time does
not grow with depth (`RuntimeOptions.scan_layers=False`: a Python loop instead). DeepStack taps
(hidden states after the blocks listed in `deepstack_visual_indexes`) are collected inside the same
scan into a small carry buffer and merged afterwards by their own stacked mergers.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from rmsweb_jax.models import sharding
from rmsweb_jax.models.attention import attention
from rmsweb_jax.models.qwen3_vl import rope
from rmsweb_jax.models.qwen3_vl.config import RuntimeOptions, VisionConfig
from rmsweb_jax.models.qwen3_vl.layers import DTYPES, dense, layer_norm, param, remat, rotate_half, run_layers, values

BLOCK_PARAMS = ("norm1_scale", "norm1_bias", "qkv_kernel", "qkv_bias", "proj_kernel", "proj_bias",
                "norm2_scale", "norm2_bias", "fc1_kernel", "fc1_bias", "fc2_kernel", "fc2_bias")
MERGER_PARAMS = ("norm_scale", "norm_bias", "fc1_kernel", "fc1_bias", "fc2_kernel", "fc2_bias")


class PatchMerger(nnx.Module):
    """2x2 patch merger (LayerNorm, Linear, exact GELU, Linear), optionally stacked `count` times."""

    def __init__(self, cfg: VisionConfig, *, postshuffle_norm: bool, count: int | None, rngs, dtype):
        m, d = cfg.merged_hidden_size, cfg.hidden_size
        lead, lead_axes = ((count,), ("layers",)) if count is not None else ((), ())
        nd = m if postshuffle_norm else d
        std = cfg.initializer_range
        self.postshuffle_norm = postshuffle_norm
        self.norm_scale = param(rngs, lead + (nd,), lead_axes + ("norm",), init="ones", dtype=dtype)
        self.norm_bias = param(rngs, lead + (nd,), lead_axes + ("norm",), init="zeros", dtype=dtype)
        self.fc1_kernel = param(rngs, lead + (m, m), lead_axes + ("merged", None), std=std, dtype=dtype)
        self.fc1_bias = param(rngs, lead + (m,), lead_axes + (None,), init="zeros", dtype=dtype)
        self.fc2_kernel = param(rngs, lead + (m, cfg.out_hidden_size), lead_axes + ("merged", "embed"), std=std,
                                dtype=dtype)
        self.fc2_bias = param(rngs, lead + (cfg.out_hidden_size,), lead_axes + ("embed",), init="zeros",
                              dtype=dtype)


def merge(p: dict[str, jax.Array], x: jax.Array, merged: int, postshuffle_norm: bool, dtype) -> jax.Array:
    """Returns merged tokens [N/4, out] from patch features [N, D] (one merger's params `p`)."""
    if postshuffle_norm:
        x = layer_norm(x.reshape(-1, merged), p["norm_scale"], p["norm_bias"])
    else:
        x = layer_norm(x, p["norm_scale"], p["norm_bias"]).reshape(-1, merged)
    x = x @ p["fc1_kernel"].astype(dtype) + p["fc1_bias"].astype(dtype)
    x = jax.nn.gelu(x, approximate=False)
    return x @ p["fc2_kernel"].astype(dtype) + p["fc2_bias"].astype(dtype)


class VisionTower(nnx.Module):
    def __init__(self, cfg: VisionConfig, runtime: RuntimeOptions, *, rngs: nnx.Rngs, mesh=None,
                 rules=sharding.DEFAULT_RULES):
        self.cfg, self.runtime, self.mesh, self.rules = cfg, runtime, mesh, rules
        dt = DTYPES[runtime.param_dtype]
        d, i, h, hd, n = cfg.hidden_size, cfg.intermediate_size, cfg.num_heads, cfg.head_dim, cfg.depth
        std = cfg.initializer_range
        self.patch_kernel = param(rngs, (cfg.patch_dim, d), ("patch", "vision_embed"), std=std, dtype=dt)
        self.patch_bias = param(rngs, (d,), ("vision_embed",), init="zeros", dtype=dt)
        self.pos_embed = param(rngs, (cfg.num_position_embeddings, d), ("pos_table", "vision_embed"), std=std,
                               dtype=dt)
        L = ("layers",)
        self.norm1_scale = param(rngs, (n, d), L + ("norm",), init="ones", dtype=dt)
        self.norm1_bias = param(rngs, (n, d), L + ("norm",), init="zeros", dtype=dt)
        self.qkv_kernel = param(rngs, (n, d, 3, h, hd), L + ("vision_embed", None, "vision_heads", "head_dim"),
                                std=std, dtype=dt)
        self.qkv_bias = param(rngs, (n, 3, h, hd), L + (None, "vision_heads", "head_dim"), init="zeros", dtype=dt)
        self.proj_kernel = param(rngs, (n, h, hd, d), L + ("vision_heads", "head_dim", "vision_embed"), std=std,
                                 dtype=dt)
        self.proj_bias = param(rngs, (n, d), L + ("vision_embed",), init="zeros", dtype=dt)
        self.norm2_scale = param(rngs, (n, d), L + ("norm",), init="ones", dtype=dt)
        self.norm2_bias = param(rngs, (n, d), L + ("norm",), init="zeros", dtype=dt)
        self.fc1_kernel = param(rngs, (n, d, i), L + ("vision_embed", "vision_mlp"), std=std, dtype=dt)
        self.fc1_bias = param(rngs, (n, i), L + ("vision_mlp",), init="zeros", dtype=dt)
        self.fc2_kernel = param(rngs, (n, i, d), L + ("vision_mlp", "vision_embed"), std=std, dtype=dt)
        self.fc2_bias = param(rngs, (n, d), L + ("vision_embed",), init="zeros", dtype=dt)
        self.merger = PatchMerger(cfg, postshuffle_norm=False, count=None, rngs=rngs, dtype=dt)
        n_ds = len(cfg.deepstack_visual_indexes)
        self.deepstack_mergers = (PatchMerger(cfg, postshuffle_norm=True, count=n_ds, rngs=rngs, dtype=dt)
                                  if n_ds else None)

    def __call__(self, pixel_values: jax.Array, rot_pos: jax.Array, interp_idx: jax.Array, interp_w: jax.Array,
                 segment_ids: jax.Array) -> tuple[jax.Array, jax.Array | None]:
        """Returns (merged [N/4, out], deepstack [n_ds, N/4, out] or None) from patches [N, patch_dim].

        rot_pos [N, 2], interp_idx/interp_w [N, 4], segment_ids [N] come from the host-side helpers in
        `rope`; padded patches carry segment id 0 and are never read by the text model.
        """
        cfg = self.cfg
        dt = DTYPES[self.runtime.compute_dtype]
        x = pixel_values.astype(dt) @ self.patch_kernel[...].astype(dt) + self.patch_bias[...].astype(dt)
        pos = jnp.take(self.pos_embed[...], interp_idx, axis=0)  # [N, 4, D]
        x = x + jnp.sum(pos * interp_w[..., None].astype(pos.dtype), axis=1).astype(dt)
        x = sharding.constrain(x, ("patches", "vision_embed"), self.mesh, self.rules)
        cos, sin = rope.vision_cos_sin(rot_pos, head_dim=cfg.head_dim, theta=cfg.rope_theta)
        seg = segment_ids[None]
        # Images sit in order and none exceeds the window (checked on the host by check_vision_window), so
        # attention over the band of `vision_window` around each patch is exact: linear in the images.
        window = self.runtime.vision_window or None
        ds_slot = jnp.full((cfg.depth,), len(cfg.deepstack_visual_indexes), jnp.int32)
        for j, layer in enumerate(cfg.deepstack_visual_indexes):
            ds_slot = ds_slot.at[layer].set(j)
        n_ds = len(cfg.deepstack_visual_indexes)
        taps = jnp.zeros((n_ds + 1,) + x.shape, x.dtype)  # the extra slot absorbs non-tap layers

        def block(carry, xs):
            h, taps = carry
            p, slot = xs
            y = layer_norm(h, p["norm1_scale"], p["norm1_bias"])
            qkv = dense(y, p["qkv_kernel"].astype(dt)) + p["qkv_bias"].astype(dt)
            q, k, v = qkv[:, 0], qkv[:, 1], qkv[:, 2]
            # Rotation in fp32 as transformers does, then back to the compute dtype.
            q = (q.astype(jnp.float32) * cos[:, None] + _rot(q) * sin[:, None]).astype(dt)
            k = (k.astype(jnp.float32) * cos[:, None] + _rot(k) * sin[:, None]).astype(dt)
            o = attention(q[None], k[None], v[None], q_segment_ids=seg, kv_segment_ids=seg, causal=False,
                          impl=self.runtime.attention_impl, window=window, mesh=self.mesh, rules=self.rules,
                          head_axes=("vision_heads", "vision_heads"))[0]
            h = h + dense(o, p["proj_kernel"].astype(dt), n_in=2) + p["proj_bias"].astype(dt)
            y = layer_norm(h, p["norm2_scale"], p["norm2_bias"])
            y = jax.nn.gelu(y @ p["fc1_kernel"].astype(dt) + p["fc1_bias"].astype(dt), approximate=True)
            h = h + y @ p["fc2_kernel"].astype(dt) + p["fc2_bias"].astype(dt)
            h = sharding.constrain(h, ("patches", "vision_embed"), self.mesh, self.rules)
            taps = jax.lax.dynamic_update_index_in_dim(taps, h, slot, axis=0)
            return (h, taps), None

        body = remat(block, self.runtime.remat_policy)
        (x, taps), _ = run_layers(body, (x, taps), (values(self, BLOCK_PARAMS), ds_slot),
                                  scan=self.runtime.scan_layers)
        merged = merge(values(self.merger, MERGER_PARAMS), x, cfg.merged_hidden_size, False, dt)
        if not n_ds:
            return merged, None
        ds_params = values(self.deepstack_mergers, MERGER_PARAMS)
        deepstack = jax.vmap(lambda p, t: merge(p, t, cfg.merged_hidden_size, True, dt))(ds_params, taps[:n_ds])
        return merged, deepstack


def _rot(x: jax.Array) -> jax.Array:
    return rotate_half(x.astype(jnp.float32))
