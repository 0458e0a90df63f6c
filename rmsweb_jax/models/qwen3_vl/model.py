"""Qwen3-VL for conditional generation in Flax NNX, created directly sharded on a device mesh.

`Qwen3VL.__call__` takes transformers' input layout (input_ids, attention_mask, pixel_values,
image_grid_thw) for parity tests and interactive use; training and sampling call
`hidden_states(inputs)` on a `ModelInputs` prepared on the host by `prepare_inputs`, so the jitted
step sees only static shapes.
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rmsweb_jax.errors import UserError
from rmsweb_jax.models import sharding
from rmsweb_jax.models.qwen3_vl import rope
from rmsweb_jax.models.qwen3_vl.config import Qwen3VLConfig, RuntimeOptions
from rmsweb_jax.models.qwen3_vl.layers import num_params
from rmsweb_jax.models.qwen3_vl.text import KVCache, TextDecoder
from rmsweb_jax.models.qwen3_vl.vision import VisionTower


class VisionInputs(NamedTuple):
    pixel_values: jax.Array   # [Np, patch_dim]
    rot_pos: jax.Array        # [Np, 2] int32
    interp_idx: jax.Array     # [Np, 4] int32
    interp_w: jax.Array       # [Np, 4] f32
    segment_ids: jax.Array    # [Np] int32, 0 = padding patch


class ModelInputs(NamedTuple):
    input_ids: jax.Array      # [B, L] int32
    segment_ids: jax.Array    # [B, L] int32, 0 = padding
    position_ids: jax.Array   # [3, B, L] int32 (MRoPE t/h/w)
    vision: VisionInputs | None
    rope_deltas: jax.Array    # [B] int32: decode position = cache slot count of real tokens + delta


class ModelOutput(NamedTuple):
    logits: jax.Array         # [B, L, V] fp32
    rope_deltas: jax.Array    # [B]


class Qwen3VL(nnx.Module):
    def __init__(self, config: Qwen3VLConfig, runtime: RuntimeOptions | None = None, *, rngs: nnx.Rngs,
                 mesh=None, rules=sharding.DEFAULT_RULES):
        runtime = runtime or RuntimeOptions()
        self.config, self.runtime, self.mesh, self.rules = config, runtime, mesh, rules
        self.visual = VisionTower(config.vision, runtime, rngs=rngs, mesh=mesh, rules=rules)
        self.text = TextDecoder(config.text, runtime, tie_word_embeddings=config.tie_word_embeddings, rngs=rngs,
                                mesh=mesh, rules=rules)

    # ---- jittable core -------------------------------------------------------------------------
    def hidden_states(self, inputs: ModelInputs, cache: KVCache | None = None, prefix: KVCache | None = None
                      ) -> tuple[jax.Array, KVCache | None]:
        """Returns (final hidden states [B, L, D], updated cache); vision runs when inputs.vision is set. `prefix`:
        a read-only cache shared by groups of rows, before `cache` (TextDecoder.__call__)."""
        cfg = self.config
        ids = inputs.input_ids
        x = self.text.embed_tokens(ids)
        visual_mask = visual_index = deepstack = None
        if inputs.vision is not None:
            v = inputs.vision
            merged, deepstack = self.visual(v.pixel_values, v.rot_pos, v.interp_idx, v.interp_w, v.segment_ids)
            visual_mask = ids == cfg.image_token_id
            # Row-major running count: the k-th image token takes the k-th merged feature (masked_scatter order).
            visual_index = jnp.maximum(jnp.cumsum(visual_mask.reshape(-1)).reshape(ids.shape) - 1, 0)
            x = jnp.where(visual_mask[..., None], jnp.take(merged, visual_index, axis=0).astype(x.dtype), x)
        cos, sin = rope.mrope_cos_sin(inputs.position_ids, head_dim=cfg.text.head_dim, theta=cfg.text.rope_theta,
                                      mrope_section=cfg.text.mrope_section, dtype=x.dtype)
        return self.text(x, segment_ids=inputs.segment_ids, cos=cos, sin=sin, visual_mask=visual_mask,
                         visual_index=visual_index, deepstack=deepstack, cache=cache, prefix=prefix)

    def logits(self, hidden: jax.Array) -> jax.Array:
        """Returns fp32 logits [B, L, V] from hidden states."""
        return self.text.logits(hidden)

    # ---- HF-layout convenience -------------------------------------------------------------------
    def __call__(self, input_ids, attention_mask=None, pixel_values=None, image_grid_thw=None,
                 mm_token_type_ids=None) -> ModelOutput:
        """Returns logits for transformers-style inputs (host prep + one jitted forward)."""
        inputs = prepare_inputs(self.config, input_ids, attention_mask=attention_mask, pixel_values=pixel_values,
                                image_grid_thw=image_grid_thw, mm_token_type_ids=mm_token_type_ids,
                                vision_window=self.runtime.vision_window)
        graphdef, state = nnx.split(self)
        logits = _forward_logits(graphdef, state, inputs)
        return ModelOutput(logits, inputs.rope_deltas)


@functools.partial(jax.jit, static_argnums=0)
def _forward_logits(graphdef, state, inputs: ModelInputs) -> jax.Array:
    model = nnx.merge(graphdef, state)
    hidden, _ = model.hidden_states(inputs)
    return model.logits(hidden)


# ---- host-side input preparation ---------------------------------------------------------------
def prepare_inputs(config: Qwen3VLConfig, input_ids, *, attention_mask=None, pixel_values=None, image_grid_thw=None,
                   mm_token_type_ids=None, pad_patches_to: int | None = None, vision_window: int = 0) -> ModelInputs:
    """Returns ModelInputs (numpy) for transformers-layout inputs, validating them against each other (and the
    images against `vision_window`, the model's RuntimeOptions.vision_window)."""
    ids = np.asarray(input_ids)
    if ids.ndim != 2:
        raise ValueError(f"input_ids must be [batch, length], got shape {ids.shape}")
    mask = np.ones_like(ids, np.int32) if attention_mask is None else np.asarray(attention_mask).astype(np.int32)
    if mask.shape != ids.shape:
        raise ValueError(f"attention_mask shape {mask.shape} differs from input_ids shape {ids.shape}")
    merge = config.vision.spatial_merge_size
    n_image_tokens = int(((ids == config.image_token_id) & (mask > 0)).sum())
    vision = None
    if pixel_values is None and image_grid_thw is None:
        if n_image_tokens:
            raise ValueError(f"input_ids hold {n_image_tokens} image tokens (id {config.image_token_id}) "
                             "but no pixel_values / image_grid_thw were given")
    else:
        if pixel_values is None or image_grid_thw is None:
            raise ValueError("pixel_values and image_grid_thw must be given together")
        grid = np.asarray(image_grid_thw).astype(np.int64).reshape(-1, 3)
        pv = np.asarray(pixel_values, np.float32)
        n_patches = int(np.prod(grid, axis=1).sum())
        if pv.ndim != 2 or pv.shape != (n_patches, config.vision.patch_dim):
            raise ValueError(f"pixel_values shape {pv.shape} does not match image_grid_thw {grid.tolist()}: "
                             f"expected ({n_patches}, {config.vision.patch_dim})")
        if np.any(grid[:, 1:] % merge):
            raise ValueError(f"image_grid_thw {grid.tolist()}: h and w must be multiples of merge size {merge}")
        expected_tokens = n_patches // merge ** 2
        if n_image_tokens != expected_tokens:
            raise ValueError(f"input_ids hold {n_image_tokens} image tokens but image_grid_thw {grid.tolist()} "
                             f"needs {expected_tokens}")
        check_vision_window(grid, vision_window)
        interp_idx, interp_w = rope.vision_pos_interpolation(grid, config.vision.num_grid_per_side, merge)
        vision = VisionInputs(pv, rope.vision_rotary_positions(grid, merge), interp_idx, interp_w,
                              rope.vision_segment_ids(grid))
        if pad_patches_to is not None:
            vision = pad_vision(vision, pad_patches_to, merge)
        image_grid_thw = grid
    if mm_token_type_ids is None:
        mm_token_type_ids = (ids == config.image_token_id).astype(np.int32)
    position_ids, deltas = rope.text_position_ids(
        ids, mask, image_grid_thw, image_token_id=config.image_token_id, spatial_merge_size=merge,
        mm_token_type_ids=np.asarray(mm_token_type_ids))
    return ModelInputs(ids.astype(np.int32), mask, position_ids, vision, deltas)


def check_vision_window(image_grid_thw, window: int) -> None:
    """Returns None when every image (each frame) of `image_grid_thw` has at most `window` patches (0: no limit).

    The vision tower computes attention only within `window` patches of each patch (exact for images no
    larger); a larger image would come out all NaN, so it is refused here, before the step runs.
    """
    if not window:
        return
    for i, (t, h, w) in enumerate(np.asarray(image_grid_thw).reshape(-1, 3).tolist()):
        if h * w > window:
            raise UserError(f"image {i} of grid (t, h, w) = {(t, h, w)} has {h * w} patches per frame, more than "
                            f"config.model.vision_window = {window} (the vision attention window): raise "
                            f"config.model.vision_window to at least {h * w}, or resize images to at most {window} "
                            "patches (the image processor's max_pixels)")


def pad_vision(vision: VisionInputs, length: int, merge: int) -> VisionInputs:
    """Returns `vision` padded with inert patches (segment id 0) to `length` rows (a static bucket)."""
    n = vision.pixel_values.shape[0]
    if length < n or length % (merge * merge):
        raise ValueError(f"cannot pad {n} patches to {length}: need length >= {n} and a multiple of {merge * merge}")
    pad = length - n
    return VisionInputs(*(np.concatenate([a, np.zeros((pad,) + a.shape[1:], a.dtype)]) for a in vision))


# ---- creation, sharded from abstract shapes ----------------------------------------------------
def abstract_model(config: Qwen3VLConfig, runtime: RuntimeOptions = RuntimeOptions(), *, mesh=None,
                   rules=sharding.DEFAULT_RULES) -> Qwen3VL:
    """Returns the model with ShapeDtypeStruct leaves (no allocation)."""
    return nnx.eval_shape(lambda: Qwen3VL(config, runtime, rngs=nnx.Rngs(0), mesh=mesh, rules=rules))


def parameter_count(config: Qwen3VLConfig) -> int:
    """Returns the number of parameters, from abstract shapes."""
    return num_params(nnx.state(abstract_model(config), nnx.Param))


def state_shardings(state, mesh, rules=sharding.DEFAULT_RULES):
    """Returns a pytree of NamedShardings matching `state`, from each variable's logical `axes`."""
    def one(var):
        axes = var.get_metadata().get("axes")
        return sharding.named_sharding(mesh, axes, rules, var.shape) if mesh is not None else None
    return jax.tree.map(one, state, is_leaf=lambda x: isinstance(x, nnx.Variable))


def create(config: Qwen3VLConfig, runtime: RuntimeOptions = RuntimeOptions(), *, mesh=None,
           rules=sharding.DEFAULT_RULES, seed: int = 0) -> Qwen3VL:
    """Returns a randomly initialised model whose parameters are created already sharded on `mesh`.

    Initialisation runs as one jitted program (eager init would compile one kernel per parameter).
    """
    graphdef, abstract_state = nnx.split(abstract_model(config, runtime, mesh=mesh, rules=rules))
    out_shardings = state_shardings(abstract_state, mesh, rules) if mesh is not None else None

    @functools.partial(jax.jit, out_shardings=out_shardings)
    def init():
        # rbg keys compile far faster than threefry for many parameters (as MaxText does for init).
        rngs = nnx.Rngs(jax.random.key(seed, impl="rbg"))
        return nnx.split(Qwen3VL(config, runtime, rngs=rngs, mesh=mesh, rules=rules))[1]

    return nnx.merge(graphdef, init())
