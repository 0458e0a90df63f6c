"""Seeded draws of reference steps for mining: stratified over tasks, spread over each task's steps.

The store holds steps in commit order and collection runs task by task, so the first n training
steps are the first task's: a cap on the steps replayed must be a draw, not a prefix. The draw
gives every stratum (task) its share of n — round-robin, so n >= the number of strata puts every
stratum in, and strata too small for their share pass the rest on — and within a stratum picks
evenly spaced items of its sorted items from a seeded offset, so early and late steps of its
trajectories are both drawn. The input is sorted first: the same items in another order give the
same selection.
"""
from __future__ import annotations

from typing import Callable, Hashable, Sequence, TypeVar

import numpy as np

T = TypeVar("T")


def allocate(sizes: Sequence[int], n: int, order: Sequence[int]) -> list[int]:
    """Returns how many of `n` items each stratum (of `sizes` items) gives: one at a time round-robin over
    the strata in `order`, skipping full ones, until n are allocated or every stratum is exhausted."""
    counts = [0] * len(sizes)
    left = min(n, sum(sizes))
    while left:
        for s in order:
            if left and counts[s] < sizes[s]:
                counts[s] += 1
                left -= 1
    return counts


def stratified_sample(items: Sequence[T], stratum_of: Callable[[T], Hashable], n: int, seed: int) -> list[T]:
    """Returns a seeded draw of `n` of `items` (all of them when n >= len(items)), sorted: every stratum
    (`stratum_of(item)`) gets its round-robin share, and a stratum's picks are evenly spaced over its sorted
    items. Items must be sortable; strata must be sortable (their order is shuffled by the seed, so which
    strata get one more when n does not divide evenly depends only on the seed)."""
    if n < 0:
        raise ValueError(f"a draw of {n} items; expected n >= 0")
    ordered = sorted(items)
    if n >= len(ordered):
        return ordered
    strata: dict[Hashable, list[T]] = {}
    for item in ordered:
        strata.setdefault(stratum_of(item), []).append(item)
    keys = sorted(strata)
    rng = np.random.default_rng(seed)
    counts = allocate([len(strata[k]) for k in keys], n, rng.permutation(len(keys)).tolist())
    chosen: list[T] = []
    for key, count in zip(keys, counts):
        members = strata[key]
        if count:
            offset = rng.random()
            chosen += [members[int((j + offset) * len(members) / count)] for j in range(count)]
    return sorted(chosen)
