"""Grounding anchor rows: the ground stage's rows (an instruction naming an element of a stored page -> the action at
its centre) as extra anchor rows of a Salvage-DS update, in the batch's rows that would otherwise be padding.

Why (bench/README.md): SFT kept the grounding it started from only with grounding rows mixed into its data
(the probe fell from 56% to 8% without them). Salvage-DS then trains on mined agent steps only, and in the demo its
30 updates took the probe from 50.0% to 42.5% while RMSWeb fell 7.1 points below SFT closed loop. These rows keep the
skill in the loss: the same action-only NLL as the anchor rows of rejected groups (loss on the tool call, weighted
by config.salvage.loss.anchor_weight), at no extra compute, since the batch's size is fixed and padded anyway.
config.salvage.grounding_weight (default 1) scales their tool-call tokens' loss weight (their loss_mask value) over
the other anchor rows': with anchor_weight 0.1, a grounding_weight of 10 gives them SFT's full NLL.

Update t takes rows t*k .. t*k + k - 1 of a permutation drawn once from `seed`, so a resumed run takes exactly the
rows an uninterrupted one would.
"""
from __future__ import annotations

import numpy as np

from rmsweb_jax.agents.prompt import PromptBuilder
from rmsweb_jax.data.grounding import GroundingRows
from rmsweb_jax.processing.chat import encode_for_training
from rmsweb_jax.salvage.batches import anchor_row


class GroundingAnchors:
    """Up to `per_update` grounding anchor rows for each update, from `rows` (GroundingRows of the training split)."""

    def __init__(self, rows: GroundingRows, per_update: int, tokenizer, image_config, builder: PromptBuilder,
                 seed: int, weight: float = 1.0):
        self.rows, self.per_update, self.tokenizer, self.image_config = rows, per_update, tokenizer, image_config
        self.weight = weight
        self.builder = builder
        self.order = np.random.default_rng(seed).permutation(len(rows))

    def for_update(self, update: int, room: int) -> list[dict]:
        """Returns the anchor rows of update `update` (0-based): its min(per_update, room) next rows, as anchor_row
        builds them (loss on the tool call only)."""
        count = max(0, min(self.per_update, room))
        out = []
        for j in range(count):
            row = self.rows[int(self.order[(update * self.per_update + j) % len(self.order)])]
            encoded = encode_for_training(self.tokenizer, self.builder.messages(row.context()), row.target_text,
                                          self.image_config)
            out.append(anchor_row(encoded, self.tokenizer, f"ground:{row.name}", self.image_config.patch_dim,
                                  weight=self.weight))
        return out

    def __repr__(self) -> str:
        weight = f", tool-call tokens weighted {self.weight:g}" if self.weight != 1.0 else ""
        return f"GroundingAnchors(up to {self.per_update} a update of {self.rows!r}{weight})"
