"""Images of a host batch: which images belong to which row, and a microbatch's padded VisionInputs.

One process (batch.py) and several processes (global_images.py, which first gathers every process's
images) build their vision inputs with the same helpers, so both give the model the same arrays.
"""
from __future__ import annotations

from typing import NamedTuple, Sequence

import numpy as np

from rmsweb_jax.models.qwen3_vl import rope
from rmsweb_jax.models.qwen3_vl.config import Qwen3VLConfig
from rmsweb_jax.models.qwen3_vl.model import VisionInputs


class RowImages(NamedTuple):
    """The images of a batch's rows."""
    grids: np.ndarray          # [N, 3] each image's (t, h, w) patch grid
    starts: np.ndarray         # [N] first patch row of each image in pixels
    pixels: np.ndarray         # [P, D]
    of_row: list[list[int]]    # image indices of each row, in order


def row_images(b, config: Qwen3VLConfig, ids, seg) -> RowImages | None:
    """Returns which images belong to which row (by counting image tokens), or None without images.

    b: a validated contract batch (batch.validate_batch); ids, seg: its input_ids and segment_ids.
    """
    if "pixel_values" not in b:
        if ((ids == config.image_token_id) & (seg > 0)).any():
            raise ValueError(f"batch['input_ids'] holds image tokens (id {config.image_token_id}) but the batch has "
                             "no pixel_values / image_grid_thw")
        return None
    grids = b["image_grid_thw"].astype(np.int64).reshape(-1, 3)
    if not len(grids):
        return row_images({}, config, ids, seg)  # no images at all: text only (checks for stray image tokens)
    pixels = b["pixel_values"].astype(np.float32)
    merge = config.vision.spatial_merge_size
    patches = np.prod(grids, axis=1)
    if pixels.ndim != 2 or pixels.shape[1] != config.vision.patch_dim or pixels.shape[0] < patches.sum():
        raise ValueError(f"batch['pixel_values'] has shape {pixels.shape}; image_grid_thw {grids.tolist()} needs at "
                         f"least ({int(patches.sum())}, {config.vision.patch_dim})")
    if np.any(grids[:, 1:] % merge):
        raise ValueError(f"batch['image_grid_thw'] {grids.tolist()}: h and w must be multiples of {merge}")
    tokens = patches // merge ** 2
    per_row = ((ids == config.image_token_id) & (seg > 0)).sum(axis=1)
    of_row, nxt = [], 0
    for r, need in enumerate(per_row.tolist()):
        mine, got = [], 0
        while got < need and nxt < len(grids):
            mine.append(nxt)
            got += int(tokens[nxt])
            nxt += 1
        if got != need:
            raise ValueError(f"batch row {r} holds {need} image tokens but image_grid_thw {grids.tolist()} gives "
                             f"its images {got}: images must follow the rows' image tokens in order")
        of_row.append(mine)
    if nxt != len(grids):
        raise ValueError(f"batch['image_grid_thw'] has {len(grids)} images but the rows' image tokens use {nxt}")
    starts = np.concatenate([[0], np.cumsum(patches)[:-1]]).astype(np.int64)
    return RowImages(grids, starts, pixels, of_row)


def patch_budget(images: RowImages, order: Sequence[Sequence[int]], given: int, config: Qwen3VLConfig) -> int:
    """Returns the patch rows each microbatch is padded to: P itself with one microbatch; else the first of
    ceil(P / M), 2 ceil(P / M), 4 ceil(P / M), ... (capped at P) that fits every microbatch, so a run sees
    a few fixed shapes rather than one per batch.

    order: the rows of each microbatch; given: P, the patch rows of the batch's pixel_values.
    """
    quantum = config.vision.spatial_merge_size ** 2
    given = round_up(given, quantum)
    if len(order) == 1:
        return given
    patches = np.prod(images.grids, axis=1)
    need = max(int(sum(patches[i] for r in rows for i in images.of_row[r])) for rows in order)
    budget = round_up(-(-given // len(order)), quantum)
    while budget < need:
        budget *= 2
    return min(budget, given)


def round_up(x: int, multiple: int) -> int:
    """Returns the smallest multiple of `multiple` that is >= x."""
    return -(-x // multiple) * multiple


def microbatch_vision(config: Qwen3VLConfig, images: RowImages, rows: Sequence[int], budget: int) -> VisionInputs:
    """Returns the microbatch's VisionInputs: its rows' images in order, padded with inert patches to `budget`."""
    merge = config.vision.spatial_merge_size
    picked = [i for r in rows for i in images.of_row[r]]
    grids = images.grids[picked] if picked else np.zeros((0, 3), np.int64)
    pixels = [images.pixels[images.starts[i]:images.starts[i] + int(np.prod(images.grids[i]))] for i in picked]
    pv = np.concatenate(pixels) if pixels else np.zeros((0, config.vision.patch_dim), np.float32)
    idx, w = rope.vision_pos_interpolation(grids, config.vision.num_grid_per_side, merge)
    vision = VisionInputs(pv, rope.vision_rotary_positions(grids, merge), idx, w, rope.vision_segment_ids(grids))
    n = pv.shape[0]
    return VisionInputs(*(np.concatenate([a, np.zeros((budget - n,) + a.shape[1:], a.dtype)]) for a in vision))


def stack(parts):
    """Returns the microbatches' arrays (or VisionInputs, field by field) stacked on a new leading axis."""
    if isinstance(parts[0], VisionInputs):
        return VisionInputs(*(np.stack(f) for f in zip(*parts)))
    return np.stack(parts)
