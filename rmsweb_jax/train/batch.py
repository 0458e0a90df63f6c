"""The batch contract between a data pipeline and the trainer, and its host-side preparation.

A data pipeline hands the trainer one dict of numpy arrays per step: this process's rows of the
global batch, B = config.train.batch_size / F rows of L tokens, F the mesh's feeds (train/feeds.py: the
processes whose devices hold the same rows feed the same rows; F = jax.process_count() unless a tensor group
spans hosts):

  input_ids       int   [B, L]  token ids.
  segment_ids     int   [B, L]  0 = padding; 1, 2, ... = the sequences packed into a row (a row holding
                                one sequence is 1 on its tokens). `attention_mask` [B, L] (0/1) may be
                                given instead: one sequence per row.
  loss_mask       float [B, L]  the weight of token t AS A TARGET. Position t-1 predicts input_ids[t];
                                that prediction's cross-entropy is weighted by loss_mask[t]. So the mask is
                                1 on the tokens to learn (the assistant's thought and action) and 0
                                elsewhere; it must be 0 at t = 0, on padding and on the first token of each
                                packed sequence (nothing in its own sequence predicts those).
  pixel_values    float [P, D]  (optional, with image_grid_thw) the patches of every image of the rows, in
                                the row-major order of their image tokens; rows past the images' patches
                                are padding (a fixed P per length bucket keeps shapes static).
  image_grid_thw  int   [N, 3]  (optional) each image's (t, h, w) patch grid; N may vary.
  token_<name>    float [B, L]  (optional) a per-token field aligned like loss_mask: its value at t belongs
                                to token t AS A TARGET (e.g. token_old_logprobs[t] = the sampling policy's
                                log p(input_ids[t] | input_ids[:t])). Shifted with the targets
                                (extras[name][t] = batch[name][t + 1], 0 at L - 1), so the loss reads it at
                                the position that predicts token t. Must be finite everywhere (padding: 0).
  anything else   [B, ...]      (e.g. advantage [B], anchor [B]) a per-row field, riding along to the loss
                                function in TrainBatch.extras unchanged.
Every extra is split into microbatches with its rows and placed on the mesh like them.

`prepare_batch` turns that dict into a TrainBatch of numpy arrays led by the microbatch axis
[M, B/M, ...]: microbatch m holds rows m, m + M, m + 2M, ... (so each microbatch still spreads over
every data-parallel device). MRoPE position ids are computed here per packed sequence (the tables
of transformers' get_rope_index, restarting at each sequence); targets[t] = input_ids[t + 1] and
weights[t] = loss_mask[t + 1], with weight 0 at the last position; every `token_*` extra is shifted the
same way (so extras['token_x'][t] goes with targets[t] and weights[t]). `to_global` assembles the
global jax.Arrays over the mesh with `jax.make_array_from_process_local_data`.

With several processes, per-row arrays stay per feed (each process places its feed's rows) but the
vision inputs, replicated on the mesh, are those of the whole global batch: every process gathers
every feed's images and builds the same ones (global_images.py says why and how).
"""
from __future__ import annotations

from typing import Any, Mapping, NamedTuple

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from rmsweb_jax.errors import UserError
from rmsweb_jax.models import sharding
from rmsweb_jax.models.qwen3_vl import rope
from rmsweb_jax.models.qwen3_vl.config import Qwen3VLConfig
from rmsweb_jax.models.qwen3_vl.model import ModelInputs, VisionInputs, check_vision_window
from rmsweb_jax.train import feeds, global_images
from rmsweb_jax.train.image_batch import RowImages, microbatch_vision, patch_budget, row_images, stack

CONTRACT_KEYS = ("input_ids", "segment_ids", "attention_mask", "loss_mask", "pixel_values", "image_grid_thw")
TOKEN_PREFIX = "token_"  # extras named so are per-token fields [B, L], shifted with the targets


class TrainBatch(NamedTuple):
    """One step's model inputs, targets and weights; every leaf leads with the microbatch axis [M, ...]."""
    inputs: ModelInputs       # input_ids/segment_ids [M, b, L], position_ids [M, 3, b, L], vision [M, Pm, ...]
    targets: Any              # [M, b, L] int32: targets[..., t] = input_ids[..., t + 1]
    weights: Any              # [M, b, L] float32: weights[..., t] = loss_mask[..., t + 1]; 0 at t = L - 1
    extras: dict[str, Any]    # {name: [M, b, ...]}; token_* ones [M, b, L] shifted like weights

    @property
    def microbatches(self) -> int:
        return int(self.targets.shape[0])


def check_batch_layout(batch_size: int, microbatches: int, mesh, feed_count: int = 1) -> int:
    """Returns the rows per microbatch, or raises naming the batch size, microbatches and mesh shape.
    feed_count: the parts the batch splits into over processes (batch_feeds(mesh, rules).count)."""
    if batch_size < 1 or microbatches < 1:
        raise UserError(f"config.train.batch_size = {batch_size} and config.train.microbatches = {microbatches}: "
                        "both must be >= 1")
    if batch_size % microbatches:
        raise UserError(f"config.train.batch_size = {batch_size} is not divisible by config.train.microbatches = "
                        f"{microbatches}")
    rows = batch_size // microbatches
    shards = data_parallel_size(mesh)
    if rows % shards:
        raise UserError(f"config.train.batch_size = {batch_size} with {microbatches} microbatch(es) gives {rows} "
                        f"rows per microbatch, which do not divide over the mesh's data x fsdp = {shards} devices "
                        f"(mesh shape {_mesh_shape(mesh)}); use a batch size that is a multiple of "
                        f"{shards * microbatches}")
    if batch_size % feed_count or (batch_size // feed_count) % microbatches:
        raise UserError(f"config.train.batch_size = {batch_size} does not split into {microbatches} microbatch(es) "
                        f"on each of the {feed_count} groups of processes that feed distinct rows (mesh shape "
                        f"{_mesh_shape(mesh)} over {jax.process_count()} processes)")
    return rows


def batch_feeds(mesh, rules=sharding.DEFAULT_RULES) -> feeds.FeedLayout:
    """Returns the feeds of the batch rows on `mesh` (train/feeds.py): which processes feed the same rows."""
    if jax.process_count() == 1:
        return feeds.SINGLE
    if mesh is None:  # no mesh to read: each process its own rows (prepare_batch refuses images without one)
        return feeds.FeedLayout(tuple((p,) for p in range(jax.process_count())), jax.process_index())
    shards = data_parallel_size(mesh)
    return feeds.row_feeds(row_sharding(mesh, rules, (shards,), 0), shards)


def data_parallel_size(mesh) -> int:
    """Returns how many ways the batch is split on `mesh`: its data x fsdp size (1 without a mesh)."""
    if mesh is None:
        return 1
    return int(mesh.shape.get("data", 1) * mesh.shape.get("fsdp", 1))


def _mesh_shape(mesh) -> dict[str, int] | None:
    return None if mesh is None else dict(mesh.shape)


# ---- validation --------------------------------------------------------------------------------------
def validate_batch(batch: Mapping[str, Any], rows: int | None = None) -> dict[str, np.ndarray]:
    """Returns the batch as numpy arrays with `segment_ids` filled in, or raises naming the bad key."""
    if not isinstance(batch, Mapping):
        raise TypeError(f"a batch must be a dict of arrays, got {type(batch).__name__}")
    out = {k: np.asarray(v) for k, v in batch.items()}
    for key in ("input_ids", "loss_mask"):
        if key not in out:
            raise ValueError(f"batch has no {key!r} (keys: {sorted(out)}); see rmsweb_jax.train.batch for the contract")
    ids = out["input_ids"]
    if ids.ndim != 2 or not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(f"batch['input_ids'] must be an int array [B, L], got {ids.dtype} {ids.shape}")
    if rows is not None and ids.shape[0] != rows:
        raise ValueError(f"batch['input_ids'] has {ids.shape[0]} rows; this process expects {rows} "
                         "(config.train.batch_size / process count)")
    if "segment_ids" not in out:
        if "attention_mask" not in out:
            raise ValueError("batch needs 'segment_ids' (or 'attention_mask'); got keys " f"{sorted(out)}")
        out["segment_ids"] = (out.pop("attention_mask") > 0).astype(np.int32)
    else:
        out.pop("attention_mask", None)
    seg, mask = out["segment_ids"], out["loss_mask"]
    for key, arr in (("segment_ids", seg), ("loss_mask", mask)):
        if arr.shape != ids.shape:
            raise ValueError(f"batch[{key!r}] has shape {arr.shape}; expected input_ids' shape {ids.shape}")
    if not np.issubdtype(seg.dtype, np.integer) or seg.min() < 0:
        raise ValueError(f"batch['segment_ids'] must hold integers >= 0 (0 = padding), got {seg.dtype} "
                         f"min {seg.min()}")
    mask = mask.astype(np.float32)
    if not np.all(np.isfinite(mask)) or mask.min() < 0:
        raise ValueError("batch['loss_mask'] must be finite and >= 0 (a weight per target token)")
    starts = np.ones_like(seg, bool)
    starts[:, 1:] = seg[:, 1:] != seg[:, :-1]
    bad = (mask != 0) & (starts | (seg == 0))
    if bad.any():
        r, t = (int(i) for i in np.argwhere(bad)[0])
        raise ValueError(f"batch['loss_mask'][{r}, {t}] = {mask[r, t]} marks a token nothing predicts (position 0, "
                         "padding, or the first token of a packed sequence); loss_mask weights TARGET tokens, "
                         "each predicted by the token before it in the same sequence")
    out["segment_ids"], out["loss_mask"] = seg.astype(np.int32), mask
    out["input_ids"] = ids.astype(np.int32)
    if ("pixel_values" in out) != ("image_grid_thw" in out):
        raise ValueError("batch['pixel_values'] and batch['image_grid_thw'] must be given together")
    for key, arr in out.items():
        if key in CONTRACT_KEYS:
            continue
        if key.startswith(TOKEN_PREFIX):
            out[key] = _token_field(key, arr, ids.shape)
        elif arr.ndim == 0 or arr.shape[0] != ids.shape[0]:
            raise ValueError(f"batch[{key!r}] has shape {arr.shape}; extra keys must lead with the batch's "
                             f"{ids.shape[0]} rows")
    return out


def _token_field(key: str, arr: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
    """Returns a `token_*` extra as float32 [B, L], or raises naming it (shape, dtype, first non-finite)."""
    if arr.shape != shape:
        raise ValueError(f"batch[{key!r}] has shape {arr.shape}; a per-token field ({TOKEN_PREFIX}*) must have "
                         f"input_ids' shape {shape} (its value at t belongs to token t as a target, like loss_mask)")
    if not (np.issubdtype(arr.dtype, np.floating) or np.issubdtype(arr.dtype, np.integer)
            or arr.dtype == np.bool_):
        raise ValueError(f"batch[{key!r}] has dtype {arr.dtype}; a per-token field must be numeric")
    arr = arr.astype(np.float32)
    bad = ~np.isfinite(arr)
    if bad.any():
        r, t = (int(i) for i in np.argwhere(bad)[0])
        raise ValueError(f"batch[{key!r}][{r}, {t}] = {arr[r, t]} is not finite ({int(bad.sum())} such values); "
                         "per-token fields must be finite everywhere (write 0 at padding and unweighted tokens)")
    return arr


def shift_tokens(values: np.ndarray) -> np.ndarray:
    """Returns [B, L] values moved one position left (out[:, t] = values[:, t + 1], 0 at L - 1): a per-token
    field indexed by target token, re-indexed by the position that predicts it (like targets and weights)."""
    out = np.zeros_like(values)
    out[:, :-1] = values[:, 1:]
    return out


def unshift_tokens(values: np.ndarray) -> np.ndarray:
    """Returns [B, L] values indexed by target token from values indexed by predicting position (the inverse
    of shift_tokens but for position 0, which nothing predicts: 0), e.g. a logprobs output as token_old_logprobs."""
    out = np.zeros_like(values)
    out[:, 1:] = values[:, :-1]
    return out


def rows_of(values, microbatches: int) -> np.ndarray:
    """Returns [B, ...] rows in the contract's order from [M, B/M, ...] microbatch-major values (the inverse of
    prepare_batch's split: microbatch m holds rows m, m + M, ...)."""
    values = np.asarray(values)
    if values.shape[0] != microbatches:
        raise ValueError(f"values of shape {values.shape} do not lead with {microbatches} microbatches")
    out = np.zeros((values.shape[0] * values.shape[1],) + values.shape[2:], values.dtype)
    for m in range(microbatches):
        out[m::microbatches] = values[m]
    return out


# ---- host preparation ----------------------------------------------------------------------------------
def prepare_batch(batch: Mapping[str, Any], config: Qwen3VLConfig, microbatches: int = 1,
                  rows: int | None = None, mesh=None, rules=sharding.DEFAULT_RULES, vision_window: int = 0) -> TrainBatch:
    """Returns the TrainBatch (numpy, [M, B/M, ...]) of a contract batch (see the module docstring).

    vision_window: the model's RuntimeOptions.vision_window; a larger image is refused (model.check_vision_window).

    mesh, rules: where the rows will be placed; needed with several processes only, whose vision
    inputs list the images of all processes' rows in their global order (a collective: every process
    must call prepare_batch for every step).
    """
    b = validate_batch(batch, rows)
    ids, seg, mask = b["input_ids"], b["segment_ids"], b["loss_mask"]
    # Padding too: an out-of-range id embeds as NaN (jnp.take's fill), which masked attention still multiplies.
    if ids.min() < 0 or ids.max() >= config.text.vocab_size:
        bad = int(ids.min() if ids.min() < 0 else ids.max())
        raise ValueError(f"batch['input_ids'] holds token id {bad}, outside the model's vocabulary "
                         f"[0, {config.text.vocab_size}) (tokenizer and checkpoint do not match?)")
    n_rows, length = ids.shape
    if n_rows % microbatches:
        raise ValueError(f"a batch of {n_rows} rows does not split into {microbatches} microbatches")
    images = row_images(b, config, ids, seg)
    if images is not None:
        check_vision_window(images.grids, vision_window)
    order = [np.arange(m, n_rows, microbatches) for m in range(microbatches)]
    targets, weights = shift_tokens(ids), shift_tokens(mask)
    position_ids, deltas = _position_ids(config, ids, seg, images)
    vision = None
    if jax.process_count() > 1:
        vision = _global_vision(b, config, images, microbatches, mesh, rules)
    elif images is not None:
        budget = patch_budget(images, order, b["pixel_values"].shape[0], config)
        vision = stack([microbatch_vision(config, images, rows_m, budget) for rows_m in order])
    inputs = ModelInputs(
        input_ids=stack([ids[r] for r in order]), segment_ids=stack([seg[r] for r in order]),
        position_ids=stack([position_ids[:, r] for r in order]), vision=vision,
        rope_deltas=stack([deltas[r] for r in order]))
    extras = {k: stack([(shift_tokens(v) if k.startswith(TOKEN_PREFIX) else v)[r] for r in order])
              for k, v in b.items() if k not in CONTRACT_KEYS}
    return TrainBatch(inputs, stack([targets[r] for r in order]), stack([weights[r] for r in order]), extras)


def _global_vision(b, config: Qwen3VLConfig, images, microbatches: int, mesh, rules) -> VisionInputs | None:
    """Returns the VisionInputs of every process's images (global_images.py), the same on every process."""
    if mesh is None:
        raise ValueError(f"{jax.process_count()} processes need a mesh over their devices to place a batch "
                         "(config.mesh.shape has 1 device)")
    n_rows, length = b["input_ids"].shape
    shape = (microbatches, n_rows // microbatches * batch_feeds(mesh, rules).count, length)
    given = b["pixel_values"].shape[0] if "pixel_values" in b else 0
    return global_images.gathered_vision(config, images, n_rows, given, microbatches,
                                         row_sharding(mesh, rules, shape, 1), shape)


def _position_ids(config: Qwen3VLConfig, ids, seg, images: RowImages | None):
    """Returns (position_ids [3, B, L], rope_deltas [B]): MRoPE tables restarting at each packed sequence."""
    n_rows, length = ids.shape
    positions = np.zeros((3, n_rows, length), np.int32)
    deltas = np.zeros((n_rows,), np.int32)
    merge = config.vision.spatial_merge_size
    for r in range(n_rows):
        grids = images.grids[images.of_row[r]] if images is not None else np.zeros((0, 3), np.int64)
        used = 0
        for s in _segments(seg[r]):
            cols = np.flatnonzero(seg[r] == s)
            sub = ids[r, cols][None]
            n_tokens = int((sub == config.image_token_id).sum())
            take, got = 0, 0
            while got < n_tokens:
                got += int(np.prod(grids[used + take])) // merge ** 2
                take += 1
            pos, delta = rope.text_position_ids(sub, None, grids[used:used + take] if take else None,
                                                image_token_id=config.image_token_id, spatial_merge_size=merge)
            positions[:, r, cols] = pos[:, 0]
            deltas[r] = delta[0]
            used += take
    return positions, deltas


def _segments(seg_row: np.ndarray) -> list[int]:
    """Returns the row's nonzero segment ids in order of first appearance."""
    values, first = np.unique(seg_row, return_index=True)
    return [int(v) for v, _ in sorted(zip(values, first), key=lambda p: p[1]) if v != 0]


# ---- device placement ------------------------------------------------------------------------------------
def batch_shardings(batch: TrainBatch, mesh, rules=sharding.DEFAULT_RULES) -> TrainBatch | None:
    """Returns a TrainBatch of NamedShardings: rows over the mesh's batch axes, vision inputs replicated.

    Vision inputs are replicated because the vision tower runs on all patches of a microbatch at once
    (its activations are replicated too: the 'patches' axis maps to no mesh axis).
    """
    if mesh is None:
        return None
    count = batch_feeds(mesh, rules).count

    def rows(x, row_axis=1):
        shape = list(x.shape)
        if not isinstance(x, jax.Array):  # host rows of this process's feed: the global array has every feed's
            shape[row_axis] *= count
        return row_sharding(mesh, rules, shape, row_axis)

    replicated = NamedSharding(mesh, PartitionSpec())
    inp = batch.inputs
    vision = None if inp.vision is None else VisionInputs(*(replicated for _ in inp.vision))
    return TrainBatch(
        inputs=ModelInputs(rows(inp.input_ids), rows(inp.segment_ids), rows(inp.position_ids, row_axis=2),
                           vision, rows(inp.rope_deltas)),
        targets=rows(batch.targets), weights=rows(batch.weights),
        extras={k: rows(v) for k, v in batch.extras.items()})


def row_sharding(mesh, rules, global_shape, row_axis: int) -> NamedSharding:
    """Returns the sharding of an array of `global_shape` whose `row_axis` holds the batch rows."""
    axes = [None] * len(global_shape)
    axes[row_axis] = "batch"
    return NamedSharding(mesh, sharding.logical_to_spec(tuple(axes), rules, mesh, tuple(global_shape)))


def to_global(batch: TrainBatch, shardings: TrainBatch | None) -> TrainBatch:
    """Returns the TrainBatch as global jax.Arrays: this process's feed's rows placed with
    `jax.make_array_from_process_local_data` (plain device_put without a mesh); processes of one feed hand it
    the same rows (train/feeds.py)."""
    if shardings is None:
        return jax.tree.map(jax.device_put, batch)
    count = _feed_count(shardings.targets, row_axis=1)

    def place(x, s):
        shape = list(x.shape)
        for axis, entry in enumerate(s.spec):  # the rows' axis (the only split one): every feed's rows
            if entry is not None:
                shape[axis] *= count
        return jax.make_array_from_process_local_data(s, x, tuple(shape))

    return jax.tree.map(place, batch, shardings)


def _feed_count(row_sharding_: NamedSharding, row_axis: int) -> int:
    """Returns how many feeds the rows of arrays placed with `row_sharding_` split into (train/feeds.py)."""
    spec = tuple(row_sharding_.spec) + (None,) * (row_axis + 1)
    shards = sharding.split_size(row_sharding_.mesh, spec[row_axis])
    return feeds.row_feeds(row_sharding_, shards, row_axis, row_axis + 1).count if shards > 1 else 1


def local_rows(array, row_axis: int = 1) -> np.ndarray:
    """Returns this process's rows of a global array placed by `to_global` (the inverse of
    jax.make_array_from_process_local_data: its distinct row blocks in global order), as numpy."""
    if jax.process_count() == 1 or not isinstance(array, jax.Array):
        return np.asarray(array)
    blocks: dict[int, np.ndarray] = {}
    for shard in array.addressable_shards:
        rows = shard.index[row_axis]
        blocks.setdefault(rows.start or 0, np.asarray(shard.data))
    full = [b for _, b in sorted(blocks.items())]
    # Batch arrays are split over their rows only (row_sharding); anything else would need a gather first.
    if any(b.shape[:row_axis] + b.shape[row_axis + 1:] != array.shape[:row_axis] + array.shape[row_axis + 1:]
           for b in full):
        raise ValueError(f"local_rows: array {array.shape} with sharding {array.sharding} is split along an axis "
                         f"other than the rows (axis {row_axis})")
    return np.concatenate(full, axis=row_axis)


def batch_counts(batch: TrainBatch, feed_count: int = 1) -> dict[str, float]:
    """Returns this process's token counts (real tokens, target tokens, real image patches) for metrics.

    With several processes the vision inputs are the whole batch's: patches and images are then this
    feed's share (the total / feed count), so that the loop's sum over the feeds' leads is the total.
    """
    vision = batch.inputs.vision
    share = 1 / feed_count
    return {"tokens": int((np.asarray(batch.inputs.segment_ids) > 0).sum()),
            "target_tokens": int((np.asarray(batch.weights) != 0).sum()),
            "patches": 0 if vision is None else int((np.asarray(vision.segment_ids) > 0).sum()) * share,
            "images": 0 if vision is None else int(np.asarray(vision.segment_ids).max(axis=-1).sum()) * share}
