"""Which sampled groups Salvage-DS trains on, and their advantages: `route_groups`.

One call of kernels.grouped_advantage over a [groups, G] block gives every group's advantages
and its two flags, computed from the samples' correctness (never from the reward's sign, so
the gates mean the same under polarized, graded and partial-credit rewards):

- "none": plain GRPO. Every non-empty group is accepted; a group whose rewards are all equal
  gets zero advantages by itself (the kernel makes r - mean exactly 0), so it trains nothing.
- "contrast": DAPO-style filtering. A group is accepted when it holds correct and incorrect
  samples and its reward std is above contrast_std_min; so no accepted group is all zeros.
- "contrast_competence": contrast, and the share of correct samples in [competence_min,
  competence_max] (configs/common.py says why the defaults make this a real gate).

Rejected groups' advantages are exactly 0; they reach the update only through the anchor.
Ragged groups (fewer valid samples than G) go through the kernel's mask.
"""
from __future__ import annotations

import dataclasses
from typing import NamedTuple

import numpy as np

from kernels.grouped_advantage import GroupStats, grouped_advantages
from rmsweb_jax.errors import UserError

GATES = ("none", "contrast", "contrast_competence")


@dataclasses.dataclass(frozen=True)
class GateSettings:
    """config.salvage's gate settings: `gates` (GATES), the contrast std floor, the competence
    range and whether advantages are divided by the group's std."""

    gates: str
    contrast_std_min: float
    competence_min: float
    competence_max: float
    std_normalize: bool

    def __post_init__(self):
        if self.gates not in GATES:
            raise UserError(f"config.salvage.gates = {self.gates!r}; expected one of {list(GATES)}")
        if not 0.0 <= self.competence_min <= self.competence_max <= 1.0:
            raise UserError(f"config.salvage.competence_min / competence_max = {self.competence_min} / "
                            f"{self.competence_max}; expected 0 <= min <= max <= 1")
        if self.contrast_std_min < 0:
            raise UserError(f"config.salvage.contrast_std_min = {self.contrast_std_min}; expected >= 0")

    @classmethod
    def from_config(cls, salvage) -> "GateSettings":
        """Returns the gate settings of the config.salvage block."""
        return cls(gates=str(salvage.gates), contrast_std_min=float(salvage.contrast_std_min),
                   competence_min=float(salvage.competence_min), competence_max=float(salvage.competence_max),
                   std_normalize=bool(salvage.std_normalize))


class RoutedGroups(NamedTuple):
    """route_groups' answer, as numpy arrays: `accepted` [groups] bool, `advantages` [groups, G]
    float32 (0 for rejected groups and masked samples), the kernel's `stats` (GroupStats)."""

    accepted: np.ndarray
    advantages: np.ndarray
    stats: GroupStats


def route_groups(rewards, correct, mask, settings: GateSettings, impl: str | None = None) -> RoutedGroups:
    """Returns which of the groups (rows of rewards / correct / mask, each [groups, G]) pass
    `settings.gates`, and their advantages (exactly 0 for rejected groups)."""
    rewards = np.asarray(rewards, np.float32)
    mask = np.ones(rewards.shape, bool) if mask is None else np.asarray(mask, bool)
    stats = grouped_advantages(rewards, mask, correct=np.asarray(correct, bool), impl=impl,
                               std_normalize=settings.std_normalize, contrast_std_min=settings.contrast_std_min,
                               competence_min=settings.competence_min, competence_max=settings.competence_max)
    stats = GroupStats(*(np.asarray(x) for x in stats))
    if settings.gates == "none":
        accepted = stats.count > 0
    elif settings.gates == "contrast":
        accepted = stats.contrast.copy()
    else:
        accepted = stats.contrast & stats.competence
    advantages = np.where(accepted[:, None] & mask, stats.advantages, 0.0).astype(np.float32)
    return RoutedGroups(np.asarray(accepted, bool), advantages, stats)
