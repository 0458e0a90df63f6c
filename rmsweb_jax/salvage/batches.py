"""One Salvage-DS update's batch: policy rows of accepted groups, anchor rows of rejected ones.

Rows are one sequence each (bucketed, never packed: the loss reads per-row extras):

- policy row: the state's prompt ids + one sample's exact sampled ids (never re-tokenized text;
  the stop token included when the sample stopped); loss_mask 1 on the sampled ids; extras
  `advantage` (the sample's group advantage) and `anchor` 0.
- anchor row: the prompt + the state's REFERENCE turn as encode_for_training renders it; loss_mask
  1 on the `<tool_call>...</tool_call>` tokens only (processing.chat.action_token_span: the thought
  is context with no loss, and so is the closing <|im_end|>); `advantage` 0, `anchor` 1.
- `token_old_logprobs` [B, L] is a zero placeholder aligned with input_ids as targets (the value at
  t belongs to token t): the stage fills it from the trainer's own forward pass over these exact
  rows before the update (Trainer.token_logprobs).

Each row carries its prompt's images (the prompt's patches repeated per row). The batch takes the
smallest bucket (config.data.buckets / bucket_patches) holding every row and is padded to
config.train.batch_size rows; padding rows are all zero (mask 0, advantage 0, anchor 0). Policy
rows must all fit (the config must allow B x G rows); anchor rows fill what is left, in draw
order, and the ones that do not fit are counted, not silently lost.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import numpy as np

from rmsweb_jax.data.batching import Buckets, OversizeError, assemble
from rmsweb_jax.errors import UserError
from rmsweb_jax.processing.chat import action_token_span

OLD_LOGPROBS = "token_old_logprobs"


@dataclasses.dataclass(frozen=True)
class PromptTokens:
    """A state's prompt as the sampler saw it: ids, its images' patches [p, D] and grids [k, 3], a name."""

    input_ids: np.ndarray
    pixel_values: np.ndarray
    image_grid_thw: np.ndarray
    name: str

    @classmethod
    def from_encoded(cls, enc, name: str, patch_dim: int) -> "PromptTokens":
        """Returns the prompt part of an EncodedChat (encode_chat's, or encode_for_training's first
        prompt_length tokens; both tokenize the prompt the same way)."""
        pixels = enc.pixel_values if enc.pixel_values is not None else np.zeros((0, patch_dim), np.float32)
        grids = enc.image_grid_thw if enc.image_grid_thw is not None else np.zeros((0, 3), np.int64)
        ids = np.asarray(enc.input_ids[:enc.prompt_length], np.int32)
        return cls(ids, np.asarray(pixels, np.float32), np.asarray(grids, np.int64).reshape(-1, 3), name)


def policy_rows(prompt: PromptTokens, samples: Sequence[Any], advantages: np.ndarray, valid: np.ndarray
                ) -> list[dict[str, Any]]:
    """Returns one row per valid sample (each with `token_ids`, e.g. a Completion): prompt + the
    exact sampled ids, loss on the sampled ids, the sample's advantage."""
    rows = []
    for j, (sample, ok) in enumerate(zip(samples, valid)):
        if not ok:
            continue
        sampled = np.asarray(sample.token_ids, np.int32)
        if not len(sampled):
            raise ValueError(f"{prompt.name} sample {j}: no sampled tokens")
        ids = np.concatenate([prompt.input_ids, sampled])
        mask = np.zeros(len(ids), np.float32)
        mask[len(prompt.input_ids):] = 1.0
        rows.append(_row(prompt, ids, mask, advantage=float(advantages[j]), anchor=0.0, name=f"{prompt.name}#{j}"))
    return rows


def anchor_row(encoded, tokenizer, name: str, patch_dim: int, weight: float = 1.0) -> dict[str, Any]:
    """Returns the anchor row of an EncodedChat of prompt + reference turn (encode_for_training):
    loss only on the reference's tool-call tokens, each weighted `weight` (its loss_mask value)."""
    lo, hi = action_token_span(encoded.input_ids, encoded.prompt_length, tokenizer)
    mask = np.zeros(len(encoded.input_ids), np.float32)
    mask[lo:hi] = weight
    prompt = PromptTokens.from_encoded(encoded, name, patch_dim)
    return _row(prompt, np.asarray(encoded.input_ids, np.int32), mask, advantage=0.0, anchor=1.0,
                name=f"{name}#anchor")


def _row(prompt: PromptTokens, ids, mask, *, advantage: float, anchor: float, name: str) -> dict[str, Any]:
    return {"input_ids": ids, "loss_mask": mask, "pixel_values": prompt.pixel_values,
            "image_grid_thw": prompt.image_grid_thw, "advantage": advantage, "anchor": anchor, "name": name}


@dataclasses.dataclass(frozen=True)
class BatchInfo:
    """What went into a batch: rows of each kind, padding, anchor rows left out, the bucket length."""

    policy_rows: int
    anchor_rows: int
    anchor_rows_dropped: int
    padding_rows: int
    length: int
    grounding_rows: int  # grounding anchor rows (salvage/grounding_anchor.py) in the room the others left

    def metrics(self) -> dict[str, float]:
        """Returns the counts as metric scalars."""
        return {k: float(v) for k, v in dataclasses.asdict(self).items()}


def salvage_batch(policy: Sequence[dict], anchors: Sequence[dict], buckets: Buckets, batch_size: int, *,
                  pad_id: int = 0, feed_index: int = 0, feed_count: int = 1, grounding: Sequence[dict] = ()
                  ) -> tuple[dict[str, np.ndarray], BatchInfo]:
    """Returns (this process's rows of the global batch, what it holds). The batch follows the
    trainer's contract plus `advantage` [b], `anchor` [b] and `token_old_logprobs` [b, L] (zeros).
    `grounding` rows (anchor rows too) fill what room the policy and anchor rows leave, never more."""
    if len(policy) > batch_size:
        raise ValueError(f"{len(policy)} policy rows (accepted groups x samples) exceed config.train.batch_size = "
                         f"{batch_size}: use batch_size >= config.salvage.groups_per_step x group_size")
    room = batch_size - len(policy)
    rows = list(policy) + list(anchors[:room])
    kept_anchors = len(rows) - len(policy)
    rows += list(grounding[:batch_size - len(rows)])
    bucket = 0
    for row in rows:
        tokens, patches = len(row["input_ids"]), len(row["pixel_values"])
        b = buckets.fit(tokens, patches)
        if b is None:
            raise OversizeError(f"Salvage-DS row {row['name']}: {buckets.describe(tokens, patches)}; raise "
                                "config.data.buckets / bucket_patches or lower config.salvage.max_new_tokens")
        bucket = max(bucket, b)
    if batch_size % feed_count:
        raise UserError(f"config.train.batch_size = {batch_size} does not split over {feed_count} feeds (groups "
                        "of processes that hold distinct rows)")
    local = batch_size // feed_count
    mine = (rows + [None] * (batch_size - len(rows)))[feed_index * local:(feed_index + 1) * local]
    length, patches = buckets.lengths[bucket], buckets.patches[bucket]
    batch = assemble([[] if r is None else [r] for r in mine], length, local * patches, buckets.patch_dim, pad_id)
    batch["advantage"] = np.asarray([0.0 if r is None else r["advantage"] for r in mine], np.float32)
    batch["anchor"] = np.asarray([0.0 if r is None else r["anchor"] for r in mine], np.float32)
    batch[OLD_LOGPROBS] = np.zeros((local, length), np.float32)
    info = BatchInfo(len(policy), kept_anchors, len(anchors) - kept_anchors, batch_size - len(rows), length,
                     len(rows) - len(policy) - kept_anchors)
    return batch, info

