"""Which rows of the global batch each process feeds: the batch layout read from the mesh, not from process ids.

A process feeds the rows its devices hold. On a pod a tensor group may span hosts (tensor 8 over 4-chip hosts),
so several processes hold the same row block and must feed the same rows; with one device per data shard over
several hosts, each host holds its own block. A *feed* is the set of processes whose devices hold the same rows:
the feeds split the global batch into equal parts, and the processes of one feed load identical rows (their
pipelines are sharded by feed, not by process). With one process per row block, feeds are processes.
"""
from __future__ import annotations

import dataclasses
import functools

import jax
import numpy as np


@dataclasses.dataclass(frozen=True)
class FeedLayout:
    """The feeds of a row sharding, and this process's among them."""
    groups: tuple[tuple[int, ...], ...]  # each feed's processes, feeds in the order of the rows they hold
    index: int                           # this process's feed

    @property
    def count(self) -> int:
        """Returns how many parts the global batch splits into (one per feed)."""
        return len(self.groups)

    @property
    def processes(self) -> tuple[int, ...]:
        """Returns the processes that feed the same rows as this one (itself included)."""
        return self.groups[self.index]

    @property
    def leads(self) -> bool:
        """Returns whether this process speaks for its feed when counts are summed over processes (its lowest)."""
        return jax.process_index() == self.processes[0]

    def of_process(self, process: int) -> int:
        """Returns the feed of `process`."""
        for index, group in enumerate(self.groups):
            if process in group:
                return index
        raise ValueError(f"process {process} holds no rows of the batch (feeds {self.groups})")


SINGLE = FeedLayout(((0,),), 0)


@functools.lru_cache(maxsize=64)
def row_feeds(sharding: jax.sharding.Sharding, rows: int, row_axis: int = 0, ndim: int = 1) -> FeedLayout:
    """Returns the feeds of an array of `ndim` dims whose axis `row_axis` holds `rows` rows placed with `sharding`.

    Raises naming the sharding when two processes hold overlapping but different rows (no feed can be formed:
    a process would have to load part of another's rows), or when the feeds would hold unequal shares."""
    if jax.process_count() == 1:
        return SINGLE
    shape = [1] * ndim
    shape[row_axis] = rows
    held: dict[int, set[tuple[int, int]]] = {}
    for device, index in sharding.devices_indices_map(tuple(shape)).items():
        start, stop, _ = index[row_axis].indices(rows)
        held.setdefault(device.process_index, set()).add((start, stop))
    try:
        return feeds_of(held, rows, jax.process_index())
    except ValueError as err:
        raise ValueError(f"{err} (sharding {sharding})") from None


def feeds_of(held: dict[int, set[tuple[int, int]]], rows: int, me: int) -> FeedLayout:
    """Returns the feeds of `rows` rows when process p holds the row spans held[p] ((start, stop) pairs), as
    process `me` sees them; raises when processes hold overlapping but different rows or unequal shares."""
    by_rows: dict[frozenset, list[int]] = {}
    for process, spans in held.items():
        by_rows.setdefault(frozenset(spans), []).append(process)
    covered = np.zeros(rows, np.int64)
    for spans in by_rows:
        for start, stop in spans:
            covered[start:stop] += 1
    if (covered != 1).any():
        bad = int(np.flatnonzero(covered != 1)[0])
        raise ValueError(f"row {bad} of a batch of {rows} rows is held by {int(covered[bad])} different sets of "
                         "processes: processes that share a row must hold the same rows (lay the mesh's tensor axis "
                         "over whole row blocks)")
    sizes = {sum(stop - start for start, stop in spans) for spans in by_rows}
    if len(sizes) != 1:
        raise ValueError(f"the feeds hold unequal numbers of rows {sorted(sizes)} of {rows}")
    ordered = sorted(by_rows.items(), key=lambda item: min(start for start, _ in item[0]))
    groups = tuple(tuple(sorted(processes)) for _, processes in ordered)
    return FeedLayout(groups, next(i for i, group in enumerate(groups) if me in group))
