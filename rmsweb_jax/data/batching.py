"""Fixed-shape training batches from encoded examples: length buckets, or rows packed with segment ids.

An encoded example is a dict (see `data.sft.encode_example`):

    input_ids       int32   [n]      prompt + assistant turn, image placeholders expanded
    loss_mask       float32 [n]      1 on the target tokens (0 on the prompt, so 0 at t = 0)
    pixel_values    float32 [p, D]   the example's image patches in token order (p may be 0)
    image_grid_thw  int64   [k, 3]   its images' grids (k may be 0)
    name            str              where it came from ("<request id>/<step>"), for messages
    token_<name>    float   [n]      (optional) per-token fields aligned with input_ids like loss_mask (e.g. the
                                     sampling policy's log-probs of an RL response)
    <other>         number / [...]   (optional) per-row fields (e.g. advantage, anchor)

The optional fields travel into the batch: token_* ones placed like loss_mask ([B, L], 0 on padding
and between packed sequences), per-row ones stacked ([B, ...], 0 on padding rows; only when every
row holds one example, i.e. bucketing: a packed row has no single value). Every example of a batch
must carry the same optional fields.

Batches follow the trainer's contract (rmsweb_jax/train/batch.py): input_ids / segment_ids /
loss_mask [B, L], pixel_values [P, D] (every image of the batch in row-major token order, then
zero rows) and image_grid_thw [N, 3]. Shapes come from a short list of buckets, so the jitted
step compiles a few times, not once per batch:

- "bucket": B consecutive examples, one per row, padded to the smallest bucket (L_b tokens,
  B x patches_b patch rows) that holds each of them.
- "pack": examples placed first-fit into B rows of the largest bucket's length (segment ids
  1, 2, ... per row; the patch budget B x patches_b is shared by the batch); an example that fits
  no row closes the batch and opens the next one.

An example no bucket holds (more tokens than the largest bucket, or more patches than the row
budget of the bucket its tokens need, or of any larger one) is refused with an error naming it
(`too_long="error"`), or dropped and counted (`too_long="drop"`; logged at the first drop and
at every power of two).

Both batchers are Grain IterDatasets: they run inside Grain's worker processes (before
`mp_prefetch`), and their iterator state is their parent's state at the first example not yet
in a returned batch, so `set_state` resumes with exactly the batches an uninterrupted run gets.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Iterator, Sequence

import grain
import numpy as np
from absl import logging
from rmsweb_jax.errors import UserError

BATCHING_MODES = ("bucket", "pack")
EXAMPLE_KEYS = ("input_ids", "loss_mask", "pixel_values", "image_grid_thw", "name")
TOKEN_PREFIX = "token_"  # as train/batch.py's contract: per-token fields aligned with input_ids
TOO_LONG_MODES = ("error", "drop")


class OversizeError(ValueError):
    """An example that no configured bucket holds (too_long="error")."""


@dataclasses.dataclass(frozen=True)
class Buckets:
    """Row lengths (tokens) and per-row image patch budgets, ascending; patches a multiple of `quantum`."""

    lengths: tuple[int, ...]
    patches: tuple[int, ...]
    patch_dim: int
    quantum: int = 4  # merge_size ** 2: the vision tower merges patches in groups of this many

    def __post_init__(self):
        lengths, patches = tuple(int(x) for x in self.lengths), tuple(int(x) for x in self.patches)
        if not lengths:
            raise UserError("config.data.buckets is empty; expected row lengths in tokens, e.g. (2048, 4096)")
        if len(patches) != len(lengths):
            raise UserError(f"config.data.bucket_patches {patches} needs one patch budget per bucket of "
                            f"config.data.buckets {lengths}")
        if any(a >= b for a, b in zip(lengths, lengths[1:])) or lengths[0] < 2:
            raise UserError(f"config.data.buckets {lengths} must be strictly increasing lengths >= 2")
        if any(a > b for a, b in zip(patches, patches[1:])) or any(p < 0 or p % self.quantum for p in patches):
            raise UserError(f"config.data.bucket_patches {patches} must be non-decreasing multiples of "
                            f"{self.quantum} (merge_size**2)")
        object.__setattr__(self, "lengths", lengths)
        object.__setattr__(self, "patches", patches)

    def fit(self, tokens: int, patches: int) -> int | None:
        """Returns the index of the smallest bucket holding an example of `tokens` and `patches`, or None."""
        for b, (length, budget) in enumerate(zip(self.lengths, self.patches)):
            if tokens <= length and patches <= budget:
                return b
        return None

    def describe(self, tokens: int, patches: int) -> str:
        """Returns why an example of this size fits no bucket."""
        if tokens > self.lengths[-1]:
            return f"{tokens} tokens > the largest bucket's {self.lengths[-1]} (config.data.buckets)"
        b = next(i for i, length in enumerate(self.lengths) if tokens <= length)
        return (f"{patches} image patches > the row budget {self.patches[-1]} of bucket {self.lengths[b]} or any "
                f"larger one (config.data.bucket_patches {self.patches})")


def example_size(example: dict) -> tuple[int, int]:
    """Returns (tokens, image patches) of an encoded example."""
    return int(len(example["input_ids"])), int(len(example["pixel_values"]))


def assemble(rows: Sequence[Sequence[dict]], length: int, patch_rows: int, patch_dim: int,
             pad_id: int = 0) -> dict[str, np.ndarray]:
    """Returns the contract batch of `rows` (each a list of examples packed in order) at fixed shapes.

    input_ids / segment_ids / loss_mask [len(rows), length]; pixel_values [patch_rows, patch_dim]
    holding every image's patches in row-major token order; image_grid_thw [N, 3].
    """
    n_rows = len(rows)
    ids = np.full((n_rows, length), pad_id, np.int32)
    seg = np.zeros((n_rows, length), np.int32)
    mask = np.zeros((n_rows, length), np.float32)
    pixels, grids = [], []
    for r, row in enumerate(rows):
        at = 0
        for s, ex in enumerate(row, start=1):
            n = len(ex["input_ids"])
            if at + n > length:
                raise ValueError(f"row {r} holds {at + n} tokens; the batch is {length} wide")
            ids[r, at:at + n] = ex["input_ids"]
            seg[r, at:at + n] = s
            mask[r, at:at + n] = ex["loss_mask"]
            mask[r, at] = 0.0  # nothing in its own sequence predicts a sequence's first token
            at += n
            if len(ex["image_grid_thw"]):
                pixels.append(np.asarray(ex["pixel_values"], np.float32))
                grids.append(np.asarray(ex["image_grid_thw"], np.int64).reshape(-1, 3))
    extras = _extras(rows, length)
    pv = np.zeros((patch_rows, patch_dim), np.float32)
    used = 0
    for p in pixels:
        if p.shape[1] != patch_dim:
            raise ValueError(f"an example's pixel_values have {p.shape[1]} values per patch; expected {patch_dim}")
        if used + len(p) > patch_rows:
            raise ValueError(f"the batch's images need more than {patch_rows} patch rows")
        pv[used:used + len(p)] = p
        used += len(p)
    grid = np.concatenate(grids) if grids else np.zeros((0, 3), np.int64)
    return {"input_ids": ids, "segment_ids": seg, "loss_mask": mask, "pixel_values": pv, "image_grid_thw": grid,
            **extras}


def _extras(rows: Sequence[Sequence[dict]], length: int) -> dict[str, np.ndarray]:
    """Returns the batch's optional fields (module docstring) of `rows`' examples, or raises naming one."""
    examples = [ex for row in rows for ex in row]
    if not examples:
        return {}
    names = [k for k in examples[0] if k not in EXAMPLE_KEYS]
    for ex in examples[1:]:
        if sorted(k for k in ex if k not in EXAMPLE_KEYS) != sorted(names):
            raise ValueError(f"example {ex.get('name', '?')} has optional fields "
                             f"{sorted(k for k in ex if k not in EXAMPLE_KEYS)}; the batch's first example "
                             f"{examples[0].get('name', '?')} has {sorted(names)}: every example must carry the same")
    out = {}
    for key in names:
        if key.startswith(TOKEN_PREFIX):
            field = np.zeros((len(rows), length), np.float32)
            for r, row in enumerate(rows):
                at = 0
                for ex in row:
                    n = len(ex["input_ids"])
                    values = np.asarray(ex[key], np.float32)
                    if values.shape != (n,):
                        raise ValueError(f"example {ex.get('name', '?')}: {key!r} has shape {values.shape}; a "
                                         f"per-token field must have one value per token ({n},)")
                    field[r, at:at + n] = values
                    at += n
            out[key] = field
            continue
        if any(len(row) > 1 for row in rows):
            raise ValueError(f"per-row field {key!r} cannot go into packed rows (several examples share a row); "
                             "use config.data.batching = 'bucket'")
        first = np.asarray(examples[0][key])
        field = np.zeros((len(rows),) + first.shape, first.dtype)
        for r, row in enumerate(rows):
            for ex in row:
                value = np.asarray(ex[key])
                if value.shape != first.shape:
                    raise ValueError(f"example {ex.get('name', '?')}: per-row field {key!r} has shape {value.shape}; "
                                     f"the batch's first example has {first.shape}")
                field[r] = value
        out[key] = field
    return out


class _Oversize:
    """Refuses or drops (and counts, logging at powers of two) examples no bucket holds."""

    def __init__(self, buckets: Buckets, too_long: str):
        if too_long not in TOO_LONG_MODES:
            raise UserError(f"config.data.too_long = {too_long!r}; expected one of {TOO_LONG_MODES}")
        self.buckets, self.too_long, self.dropped = buckets, too_long, 0

    def check(self, example: dict) -> int | None:
        """Returns the example's bucket, or None when it is dropped; raises OversizeError in "error" mode."""
        tokens, patches = example_size(example)
        b = self.buckets.fit(tokens, patches)
        if b is not None:
            return b
        why = self.buckets.describe(tokens, patches)
        if self.too_long == "error":
            raise OversizeError(f"SFT example {example.get('name', '?')}: {why}; raise the buckets or set "
                                "config.data.too_long='drop'")
        self.dropped += 1
        if self.dropped & (self.dropped - 1) == 0:
            logging.warning("SFT data: dropped example %s (%s); %d dropped so far", example.get("name", "?"), why,
                            self.dropped)
        return None


class _BatchDataset(grain.IterDataset):
    """What both batchers take: rows per batch, the buckets, the pad id, what to do with oversize examples."""

    def __init__(self, parent: grain.IterDataset, *, rows: int, buckets: Buckets, pad_id: int = 0,
                 too_long: str = "error"):
        super().__init__(parent)
        if rows < 1:
            raise ValueError(f"rows per batch must be >= 1, got {rows}")
        _Oversize(buckets, too_long)  # validates too_long now rather than in a worker
        self.rows, self.buckets, self.pad_id, self.too_long = rows, buckets, pad_id, too_long


class BucketBatchDataset(_BatchDataset):
    """Batches of `rows` examples, one per row, padded to the smallest bucket holding them all."""

    def __iter__(self) -> grain.DatasetIterator:
        return _BucketIterator(self._parent.__iter__(), self)

    def __str__(self) -> str:
        return f"BucketBatchDataset(rows={self.rows}, buckets={self.buckets.lengths})"


class _BucketIterator(grain.DatasetIterator):
    def __init__(self, parent: grain.DatasetIterator, spec: BucketBatchDataset):
        super().__init__(parent)
        self.spec, self.oversize = spec, _Oversize(spec.buckets, spec.too_long)

    def __next__(self) -> dict[str, np.ndarray]:
        spec, examples, bucket = self.spec, [], 0
        while len(examples) < spec.rows:
            try:
                ex = next(self._parent)
            except StopIteration:
                if not examples:
                    raise
                break  # a finite source's last batch: the missing rows are padding
            b = self.oversize.check(ex)
            if b is not None:
                examples.append(ex)
                bucket = max(bucket, b)
        bk = spec.buckets
        return assemble([[ex] for ex in examples] + [[]] * (spec.rows - len(examples)), bk.lengths[bucket],
                        spec.rows * bk.patches[bucket], bk.patch_dim, spec.pad_id)

    def get_state(self) -> dict[str, Any]:
        return {"parent": self._parent.get_state(), "dropped": self.oversize.dropped}

    def set_state(self, state: dict[str, Any]) -> None:
        self._parent.set_state(state["parent"])
        self.oversize.dropped = int(state.get("dropped", 0))


class PackBatchDataset(_BatchDataset):
    """Batches of `rows` rows of the largest bucket's length, examples packed first-fit (segment ids)."""

    def __iter__(self) -> grain.DatasetIterator:
        return _PackIterator(self._parent.__iter__(), self)

    def __str__(self) -> str:
        return f"PackBatchDataset(rows={self.rows}, length={self.buckets.lengths[-1]})"


class _PackIterator(grain.DatasetIterator):
    def __init__(self, parent: grain.DatasetIterator, spec: PackBatchDataset):
        super().__init__(parent)
        self.spec, self.oversize = spec, _Oversize(spec.buckets, spec.too_long)
        # The example that closed the last batch, with the parent's state from before it was read:
        # the next batch starts with it, and a checkpoint taken now resumes at it.
        self._pending: tuple[dict, Any] | None = None

    def _read(self) -> tuple[dict, Any]:
        if self._pending is not None:
            pending, self._pending = self._pending, None
            return pending
        state = self._parent.get_state()
        return next(self._parent), state

    def __next__(self) -> dict[str, np.ndarray]:
        spec, bk = self.spec, self.spec.buckets
        length, budget = bk.lengths[-1], spec.rows * bk.patches[-1]
        rows: list[list[dict]] = [[] for _ in range(spec.rows)]
        used, patches, placed = [0] * spec.rows, 0, 0
        while True:
            try:
                ex, state = self._read()
            except StopIteration:
                if not placed:
                    raise
                break
            if self.oversize.check(ex) is None:
                continue
            tokens, ex_patches = example_size(ex)
            row = next((r for r in range(spec.rows) if used[r] + tokens <= length), None)
            if row is None or patches + ex_patches > budget:
                self._pending = (ex, state)
                break
            rows[row].append(ex)
            used[row] += tokens
            patches += ex_patches
            placed += 1
        return assemble(rows, length, budget, bk.patch_dim, spec.pad_id)

    def get_state(self) -> dict[str, Any]:
        parent = self._pending[1] if self._pending is not None else self._parent.get_state()
        return {"parent": parent, "dropped": self.oversize.dropped}

    def set_state(self, state: dict[str, Any]) -> None:
        self._pending = None
        self._parent.set_state(state["parent"])
        self.oversize.dropped = int(state.get("dropped", 0))


def batch_dataset(parent: grain.IterDataset, mode: str, **kw) -> grain.IterDataset:
    """Returns the bucketing ("bucket") or packing ("pack") batcher over `parent`'s encoded examples."""
    if mode == "bucket":
        return BucketBatchDataset(parent, **kw)
    if mode == "pack":
        return PackBatchDataset(parent, **kw)
    raise UserError(f"config.data.batching = {mode!r}; expected one of {BATCHING_MODES}")


def iterate_examples(batch: dict[str, np.ndarray]) -> Iterator[tuple[int, int, int]]:
    """Yields (row, start, stop) of every sequence in a contract batch, in row-major order."""
    seg = batch["segment_ids"]
    for r in range(seg.shape[0]):
        row = seg[r]
        for s in range(1, int(row.max(initial=0)) + 1):
            cols = np.flatnonzero(row == s)
            if len(cols):
                yield r, int(cols[0]), int(cols[-1]) + 1
