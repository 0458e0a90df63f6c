"""Deterministic in-memory batches in the trainer's contract: tests, the `train_smoke` stage, demos.

A fixed set of examples (random token sequences of varied lengths whose second part is the
target) cycled in a seeded order, one epoch after another. Batch k depends only on k, so the
iterator state is just the next batch index, and a resumed run sees the batches an uninterrupted
run would have seen.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from rmsweb_jax.models.qwen3_vl.config import Qwen3VLConfig


def random_examples(config: Qwen3VLConfig, *, count: int, seq_len: int, seed: int = 0,
                    min_len: int | None = None, target_fraction: float = 0.5) -> list[dict[str, np.ndarray]]:
    """Returns `count` text examples {input_ids, segment_ids, loss_mask} [seq_len], right-padded.

    Lengths vary in [min_len, seq_len] (default seq_len // 2); the last `target_fraction` of each
    sequence's tokens are targets. Token ids avoid the model's vision special tokens.
    """
    rng = np.random.default_rng(seed)
    min_len = max(2, seq_len // 2 if min_len is None else min_len)
    forbidden = {config.image_token_id, config.video_token_id, config.vision_start_token_id,
                 config.vision_end_token_id}
    allowed = np.array([t for t in range(config.text.vocab_size) if t not in forbidden], np.int32)
    out = []
    for _ in range(count):
        n = int(rng.integers(min_len, seq_len + 1))
        ids = np.zeros(seq_len, np.int32)
        ids[:n] = rng.choice(allowed, n)
        seg = np.zeros(seq_len, np.int32)
        seg[:n] = 1
        mask = np.zeros(seq_len, np.float32)
        first_target = max(1, n - int(round(n * target_fraction)))
        mask[first_target:n] = 1.0
        out.append({"input_ids": ids, "segment_ids": seg, "loss_mask": mask})
    return out


class SyntheticBatches:
    """An endless, resumable iterator of contract batches over fixed examples (this process's rows)."""

    def __init__(self, examples: list[dict[str, np.ndarray]], *, batch_size: int, seed: int = 0,
                 feed_index: int = 0, feed_count: int = 1):
        if not examples:
            raise ValueError("SyntheticBatches needs at least one example")
        if batch_size % feed_count:
            raise ValueError(f"batch_size {batch_size} does not split over {feed_count} feeds")
        self.examples, self.batch_size, self.seed = examples, batch_size, seed
        self.local = slice(feed_index * batch_size // feed_count,
                           (feed_index + 1) * batch_size // feed_count)
        self.next_index = 0

    def batch(self, k: int) -> dict[str, np.ndarray]:
        """Returns global batch k's rows for this process's feed."""
        n = len(self.examples)
        picks = []
        for j in range(k * self.batch_size, (k + 1) * self.batch_size):
            epoch, pos = divmod(j, n)
            picks.append(int(np.random.default_rng([self.seed, epoch]).permutation(n)[pos]))
        rows = [self.examples[i] for i in picks[self.local]]
        return {key: np.stack([r[key] for r in rows]) for key in rows[0]}

    def __iter__(self) -> "SyntheticBatches":
        return self

    def __next__(self) -> dict[str, np.ndarray]:
        out = self.batch(self.next_index)
        self.next_index += 1
        return out

    def get_state(self) -> dict[str, Any]:
        return {"next_index": self.next_index}

    def set_state(self, state: dict[str, Any]) -> None:
        if not isinstance(state, dict) or "next_index" not in state:
            raise ValueError(f"SyntheticBatches state must be {{'next_index': int}}, got {state!r}")
        self.next_index = int(state["next_index"])
