"""Rotary embeddings of Qwen3-VL: interleaved MRoPE for text, 2D axial RoPE for vision.

Host-side (numpy) functions turn `image_grid_thw` and the token layout into integer position
tables, exactly as transformers' `get_rope_index` / `get_vision_position_ids` /
`get_vision_interpolation_indices_and_weights` do; in-graph (jnp) functions turn those integer
tables into cos/sin. Keeping the data-dependent part on the host leaves the jitted step shape-static.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from rmsweb_jax.models.qwen3_vl.layers import rotate_half


# ---- text: MRoPE positions (host) --------------------------------------------------------------
def text_position_ids(input_ids: np.ndarray, attention_mask: np.ndarray | None, image_grid_thw: np.ndarray | None,
                      *, image_token_id: int, spatial_merge_size: int,
                      mm_token_type_ids: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Returns (position_ids [3, B, L] int32, rope_deltas [B] int32) like transformers' get_rope_index.

    Text runs advance all three axes together; an image of grid (t, h, w) occupies t*h*w/merge^2
    tokens whose (t, h, w) positions start at the running offset, after which the offset advances by
    max(h, w)/merge. Padding (attention_mask 0) gets position 0 and is skipped.
    """
    input_ids = np.asarray(input_ids)
    b, length = input_ids.shape
    mask = np.ones_like(input_ids, dtype=bool) if attention_mask is None else np.asarray(attention_mask).astype(bool)
    types = (input_ids == image_token_id).astype(np.int32) if mm_token_type_ids is None else np.asarray(
        mm_token_type_ids)
    grids = [] if image_grid_thw is None else [tuple(int(x) for x in g) for g in np.asarray(image_grid_thw)]
    grid_iter = iter(grids)
    positions = np.zeros((3, b, length), np.int64)
    deltas = np.zeros((b,), np.int64)
    for row in range(b):
        kept = np.flatnonzero(mask[row])
        row_types = types[row, kept]
        pieces, offset, start = [], 0, 0
        while start < len(row_types):
            end = start
            while end < len(row_types) and row_types[end] == row_types[start]:
                end += 1
            if row_types[start] == 0:
                n = end - start
                pieces.append(np.broadcast_to(np.arange(n) + offset, (3, n)))
                offset += n
            else:
                try:
                    t, h, w = next(grid_iter)
                except StopIteration:
                    raise ValueError(f"row {row} has more image-token runs than image_grid_thw has images "
                                     f"({len(grids)})") from None
                gh, gw = h // spatial_merge_size, w // spatial_merge_size
                tt, hh, ww = np.meshgrid(np.arange(t), np.arange(gh), np.arange(gw), indexing="ij")
                vis = np.stack([tt.ravel(), hh.ravel(), ww.ravel()]) + offset
                if vis.shape[1] != end - start:
                    raise ValueError(f"row {row}: an image run of {end - start} tokens does not match grid "
                                     f"{(t, h, w)} ({vis.shape[1]} tokens)")
                pieces.append(vis)
                offset += max(h, w) // spatial_merge_size
            start = end
        if pieces:
            row_pos = np.concatenate(pieces, axis=1)
            positions[:, row, kept] = row_pos
            deltas[row] = row_pos.max() + 1 - len(kept)
    if next(grid_iter, None) is not None:
        raise ValueError(f"image_grid_thw has {len(grids)} images but the input ids hold fewer image-token runs")
    return positions.astype(np.int32), deltas.astype(np.int32)


def mrope_axis_map(head_dim: int, mrope_section) -> np.ndarray:
    """Returns, for each of the head_dim/2 frequencies, which axis (0=t, 1=h, 2=w) drives it (interleaved)."""
    half = head_dim // 2
    axis = np.zeros((half,), np.int32)
    for dim, offset in ((1, 1), (2, 2)):
        axis[slice(offset, mrope_section[dim] * 3, 3)] = dim
    return axis


def mrope_cos_sin(position_ids: jax.Array, *, head_dim: int, theta: float, mrope_section,
                  dtype=jnp.float32) -> tuple[jax.Array, jax.Array]:
    """Returns (cos, sin) of shape [B, L, head_dim] for interleaved MRoPE from position_ids [3, B, L]."""
    inv_freq = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))
    axis = jnp.asarray(mrope_axis_map(head_dim, mrope_section))
    pos = jnp.take(position_ids.astype(jnp.float32), axis, axis=0)  # [half, B, L]: each freq picks its axis
    freqs = jnp.moveaxis(pos, 0, -1) * inv_freq  # [B, L, half]
    emb = jnp.concatenate([freqs, freqs], axis=-1)
    return jnp.cos(emb).astype(dtype), jnp.sin(emb).astype(dtype)


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """Returns x rotated by (cos, sin); x [B, L, heads, D], cos/sin [B, L, D]."""
    cos, sin = cos[:, :, None, :], sin[:, :, None, :]
    return x * cos + rotate_half(x) * sin


# ---- vision (host) -----------------------------------------------------------------------------
def vision_rotary_positions(grid_thw: np.ndarray, merge: int) -> np.ndarray:
    """Returns [N, 2] (row, col) patch coordinates in merge-window order, repeated over t."""
    out = []
    for t, h, w in np.asarray(grid_thw).tolist():
        hpos, wpos = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
        block = (h // merge, merge, w // merge, merge)
        hpos = hpos.reshape(block).transpose(0, 2, 1, 3).ravel()
        wpos = wpos.reshape(block).transpose(0, 2, 1, 3).ravel()
        out.append(np.tile(np.stack([hpos, wpos], -1), (t, 1)))
    return np.concatenate(out).astype(np.int32) if out else np.zeros((0, 2), np.int32)


def vision_segment_ids(grid_thw: np.ndarray) -> np.ndarray:
    """Returns [N] segment ids 1, 2, ... one per (image, temporal slice): block-diagonal attention."""
    sizes = [h * w for t, h, w in np.asarray(grid_thw).tolist() for _ in range(t)]
    return np.repeat(np.arange(1, len(sizes) + 1), sizes).astype(np.int32)


def vision_pos_interpolation(grid_thw: np.ndarray, side: int, merge: int) -> tuple[np.ndarray, np.ndarray]:
    """Returns (indices [N, 4] int32, weights [N, 4] f32): bilinear, align_corners=True, merge-window order.

    Resamples the learned side x side position table to each image's (h, w) grid, as
    transformers' `get_vision_interpolation_indices_and_weights(mode='bilinear', align_corners=True)`.
    """
    idx_out, w_out = [], []
    for t, h, w in np.asarray(grid_thw).tolist():
        rows, cols = vision_rotary_positions(np.array([[1, h, w]]), merge).T
        h_taps, h_w = _axis_taps(rows, h, side)
        w_taps, w_w = _axis_taps(cols, w, side)
        idx = (h_taps[:, :, None] * side + w_taps[:, None, :]).reshape(-1, 4)
        wts = (h_w[:, :, None] * w_w[:, None, :]).reshape(-1, 4)
        idx_out.append(np.tile(idx, (t, 1)))
        w_out.append(np.tile(wts, (t, 1)))
    if not idx_out:
        return np.zeros((0, 4), np.int32), np.zeros((0, 4), np.float32)
    return np.concatenate(idx_out).astype(np.int32), np.concatenate(w_out).astype(np.float32)


def _axis_taps(index: np.ndarray, size: int, side: int) -> tuple[np.ndarray, np.ndarray]:
    # float32 arithmetic, as torch computes it, so weights match bit-for-bit in practice.
    index = index.astype(np.float32)
    src = index * np.float32(side - 1) / np.float32(max(size - 1, 1))
    floor = np.floor(src)
    offsets = np.arange(2)
    taps = np.clip(floor.astype(np.int64)[:, None] + offsets, 0, side - 1)
    dist = np.abs(src[:, None] - floor[:, None] - offsets.astype(np.float32))
    return taps, np.clip(1 - dist, 0, None).astype(np.float32)


# ---- vision (in-graph) ---------------------------------------------------------------------------
def vision_cos_sin(rot_pos: jax.Array, *, head_dim: int, theta: float) -> tuple[jax.Array, jax.Array]:
    """Returns (cos, sin) [N, head_dim] of the vision 2D axial RoPE from (row, col) positions [N, 2]."""
    spatial = head_dim // 2
    inv_freq = 1.0 / (theta ** (jnp.arange(0, spatial, 2, dtype=jnp.float32) / spatial))
    freqs = rot_pos.astype(jnp.float32)[..., None] * inv_freq  # [N, 2, hd/4]
    hw = jnp.concatenate([freqs[:, 0], freqs[:, 1]], axis=-1)
    emb = jnp.concatenate([hw, hw], axis=-1)
    return jnp.cos(emb), jnp.sin(emb)
