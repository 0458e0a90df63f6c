"""Image batches across several JAX processes: every process builds the vision inputs of the whole batch.

Why this module exists: the model (models/qwen3_vl/model.py `hidden_states`) places merged image
features by a running count of image tokens over ALL rows of a microbatch (`visual_index =
cumsum(visual_mask) - 1`), and the vision inputs are replicated on the mesh (the 'patches' axis maps
to no mesh axis). So a microbatch's VisionInputs must list the images of every global row, in global
row order, with no padding between one process's images and the next. A process holds only its own
rows' images: here every process's images are gathered (`multihost_utils.process_allgather`) and each
process assembles the same global VisionInputs from the same parts, in the order the rows take in the
global arrays, read from the rows' sharding (`row_owners`) rather than assumed. Processes of one feed
(train/feeds.py: a tensor group over several hosts) hold the same rows: their lead's part stands for them.

Shapes stay static: the gather pads every process's patches to the largest patch bucket (pixel_values
rows) of any process, and the global patch budget starts from that bucket x process count (then
image_batch.patch_budget's rule per microbatch), so a run with fixed buckets compiles the gather and
the step once. Which processes have images may change from step to step: the small metadata gather
runs every step, so all processes agree on whether the step has vision inputs at all (one program).

Single-process training never comes here (batch.prepare_batch builds its vision inputs directly).
"""
from __future__ import annotations

from typing import NamedTuple, Sequence

import jax
import numpy as np
from jax.experimental import multihost_utils

from rmsweb_jax.models.qwen3_vl.config import Qwen3VLConfig
from rmsweb_jax.models.qwen3_vl.model import VisionInputs
from rmsweb_jax.train import feeds, image_batch


class ProcessImages(NamedTuple):
    """One process's images, as every process receives them."""
    grids: np.ndarray     # [N, 3] int64: each image's (t, h, w) patch grid
    pixels: np.ndarray    # [n, D] float32: the images' patches in order, without padding
    per_row: np.ndarray   # [B] int64: images of each of the process's rows (images follow rows in order)
    given: int            # rows of the process's pixel_values: its patch bucket (0 without images)


def local_part(images, n_rows: int, given: int, patch_dim: int) -> ProcessImages:
    """Returns this process's part from image_batch.row_images' result (None: no images)."""
    if images is None:
        return ProcessImages(np.zeros((0, 3), np.int64), np.zeros((0, patch_dim), np.float32),
                             np.zeros((n_rows,), np.int64), int(given))
    n = int(np.prod(images.grids, axis=1).sum())
    return ProcessImages(images.grids.astype(np.int64), images.pixels[:n],
                         np.array([len(r) for r in images.of_row], np.int64), int(given))


def gather_parts(part: ProcessImages, quantum: int) -> list[ProcessImages]:
    """Returns every process's part, indexed by process; a collective that every process must call.

    quantum: patches per merged token (merge_size ** 2), the rounding of patch buckets.
    """
    count, me = jax.process_count(), jax.process_index()
    # int32: jax (without x64) would narrow int64 anyway.
    meta = np.concatenate([[me, part.given, len(part.grids), len(part.pixels)], part.per_row]).astype(np.int32)
    metas = np.asarray(multihost_utils.process_allgather(meta)).reshape(count, -1)
    # The gather stacks processes in the order of jax.devices(); place each part by its own index.
    where = np.argsort(metas[:, 0])
    metas = metas[where]
    if metas[:, 0].tolist() != list(range(count)):
        raise RuntimeError(f"gathered image metadata from processes {metas[:, 0].tolist()}; expected 0..{count - 1}")
    if not metas[:, 2].any():
        return [ProcessImages(part.grids[:0], part.pixels[:0], m[4:].astype(np.int64), int(m[1])) for m in metas]
    # Padded to the largest bucket (static for a run with fixed buckets: one compiled gather), not to
    # this step's largest image count, which would compile a gather per new count.
    bucket = image_batch.round_up(int(metas[:, 1].max()), quantum)
    slots = max(bucket // quantum, int(metas[:, 2].max()))
    pixels = np.zeros((bucket, part.pixels.shape[1]), np.float32)
    pixels[:len(part.pixels)] = part.pixels
    grids = np.zeros((slots, 3), np.int32)
    grids[:len(part.grids)] = part.grids
    all_pixels, all_grids = multihost_utils.process_allgather((pixels, grids))
    all_pixels, all_grids = np.asarray(all_pixels)[where], np.asarray(all_grids)[where]  # same stacking order
    return [ProcessImages(all_grids[p, :m[2]].astype(np.int64), all_pixels[p, :m[3]], m[4:].astype(np.int64),
                          int(m[1])) for p, m in enumerate(metas)]


def row_owners(row_sharding: jax.sharding.Sharding, global_shape: Sequence[int], row_axis: int = 1) -> np.ndarray:
    """Returns [rows, 2] int: (process, local row) of each global row along `row_axis`, for an array of
    `global_shape` placed with `row_sharding` by jax.make_array_from_process_local_data.

    That function maps a process's local rows, in order, onto the row slices of its devices sorted by
    start; so does this. A row held by the processes of one feed (train/feeds.py) is named by the feed's
    lead (its lowest process); raises when processes hold overlapping but different rows.
    """
    n = int(global_shape[row_axis])
    layout = feeds.row_feeds(row_sharding, n, row_axis, len(global_shape))
    leads = {group[0] for group in layout.groups}
    slices: dict[int, set[tuple[int, int]]] = {}
    for device, index in row_sharding.devices_indices_map(tuple(global_shape)).items():
        if device.process_index not in leads:
            continue
        start, stop, _ = index[row_axis].indices(n)
        slices.setdefault(device.process_index, set()).add((start, stop))
    owners = np.full((n, 2), -1, np.int64)
    for process, spans in sorted(slices.items()):
        local = 0
        for start, stop in sorted(spans):
            owners[start:stop, 0] = process
            owners[start:stop, 1] = np.arange(local, local + stop - start)
            local += stop - start
    if (owners[:, 0] < 0).any():
        raise ValueError(f"rows {np.flatnonzero(owners[:, 0] < 0).tolist()} of the global batch {tuple(global_shape)} "
                         f"sit on no device under sharding {row_sharding}")
    return owners


def global_vision(config: Qwen3VLConfig, parts: Sequence[ProcessImages], owners: np.ndarray,
                  microbatches: int) -> VisionInputs | None:
    """Returns the global batch's VisionInputs [M, P, ...] (None when no process has images).

    Pure: every process computes it from the same gathered `parts` (indexed by process) and `owners`
    (row_owners of a microbatch's [b, ...] rows; local row k of microbatch m is the process's batch row
    m + k * M, batch.prepare_batch's interleaving).
    """
    if not any(len(p.grids) for p in parts):
        return None
    rows = len(parts[0].per_row)
    if len(owners) * microbatches != rows * len(parts) or len({(int(p), int(k)) for p, k in owners}) != len(owners):
        raise ValueError(f"row owners {np.asarray(owners).tolist()} do not name each of {len(parts)} processes' "
                         f"{rows // microbatches} rows per microbatch once")
    grids = np.concatenate([p.grids for p in parts]).reshape(-1, 3)
    pixels = np.concatenate([p.pixels for p in parts])
    patches = np.prod(grids, axis=1)
    starts = np.concatenate([[0], np.cumsum(patches)[:-1]]).astype(np.int64)
    of_row, n = [], 0  # row p * rows + r: process p's row r
    for part in parts:
        for count in part.per_row.tolist():
            of_row.append(list(range(n, n + count)))
            n += count
    images = image_batch.RowImages(grids, starts, pixels, of_row)
    order = [[int(p) * rows + m + int(k) * microbatches for p, k in owners] for m in range(microbatches)]
    quantum = config.vision.spatial_merge_size ** 2
    given = image_batch.round_up(max(p.given for p in parts), quantum) * len(parts)
    budget = image_batch.patch_budget(images, order, given, config)
    return image_batch.stack([image_batch.microbatch_vision(config, images, o, budget) for o in order])


def gathered_vision(config: Qwen3VLConfig, images, n_rows: int, given: int, microbatches: int,
                    row_sharding: jax.sharding.Sharding, global_shape: Sequence[int]) -> VisionInputs | None:
    """Returns the global VisionInputs [M, P, ...] from this process's images (image_batch.row_images' result
    or None) and every other process's, gathered; a collective that every process must call each step."""
    part = local_part(images, n_rows, given, config.vision.patch_dim)
    parts = gather_parts(part, config.vision.spatial_merge_size ** 2)
    owners = row_owners(row_sharding, global_shape)
    leads = sorted({int(p) for p in owners[:, 0]})  # one process per feed: the others hold the same rows
    at = {p: i for i, p in enumerate(leads)}
    owners = np.stack([[at[int(p)] for p in owners[:, 0]], owners[:, 1]], axis=1)
    return global_vision(config, [parts[p] for p in leads], owners, microbatches)
