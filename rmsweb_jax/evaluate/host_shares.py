"""Episodes played by several hosts: each host's share of the (task, seed) pairs, merged into one store.

On a pod slice every host runs the stage; each plays its share (pairs i with i % process_count ==
process_index, in its own browser pool) into its own part store beside the policy's store
(<store>.parts/process<i>, so that hosts never write one store at once); after a barrier process 0
copies every part's task groups into the store, once (groups already there are skipped, so a merge
cut short by a kill is finished by the rerun), and removes the parts. Pairs already in the store are
no host's share: a rerun plays only what is missing. With one process the store is played directly.
"""
from __future__ import annotations

import pathlib
from typing import Any, Sequence

import jax
from jax.experimental import multihost_utils

from rmsweb_jax import storage
from rmsweb_jax.collect.records import task_key
from rmsweb_jax.collect.store import StoreWriter, TrajectoryStore
from rmsweb_jax.collect.store_layout import STORE_FILE


def part_dir(store_dir: pathlib.Path, process_index: int) -> pathlib.Path:
    """Returns the part store of host `process_index` beside `store_dir`."""
    return store_dir.with_name(store_dir.name + ".parts") / f"process{process_index}"


def stored_keys(store_dir: pathlib.Path) -> set[tuple[str, int]]:
    """Returns the (task id, seed) of every task group committed to the store (none when it does not exist)."""
    if not (store_dir / STORE_FILE).is_file():
        return set()
    with TrajectoryStore(store_dir) as store:
        return store.finished_task_keys()


def host_share(pairs: Sequence[tuple[Any, int]], done: set[tuple[str, int]], process_index: int,
               process_count: int) -> list[tuple[Any, int]]:
    """Returns the pairs (task, seed) of host `process_index`: every process_count-th of `pairs` (the same
    split on every host and every rerun), less those in `done`."""
    return [(task, seed) for i, (task, seed) in enumerate(pairs)
            if i % process_count == process_index and task_key(task.id, seed) not in done]


def this_hosts_share(store_dir: pathlib.Path, pairs: Sequence[tuple[Any, int]]
                     ) -> tuple[pathlib.Path, list[tuple[Any, int]]]:
    """Returns (the store this process plays into, the pairs it plays): `store_dir` and every pair on one
    process; on several, its part store and its share (host_share) of the pairs `store_dir` lacks."""
    hosts = jax.process_count()
    if hosts == 1:
        return store_dir, list(pairs)
    me = jax.process_index()
    return part_dir(store_dir, me), host_share(list(pairs), stored_keys(store_dir), me, hosts)


def merge_when_played(store_dir: pathlib.Path, what: str) -> None:
    """Once every host has played its share (`what` names the play in the barriers): process 0 merges the parts
    into `store_dir` between two barriers, so every host then reads the same store. Nothing on one process."""
    if jax.process_count() == 1:
        return
    multihost_utils.sync_global_devices(f"{what} played {store_dir}")
    if jax.process_index() == 0:
        merge_parts(store_dir, jax.process_count())
    multihost_utils.sync_global_devices(f"{what} merged {store_dir}")


def merge_parts(store_dir: pathlib.Path, process_count: int) -> int:
    """Returns how many task groups the part stores added to `store_dir`, having copied them there (their
    policy and provenance with them) and removed the parts. Process 0 calls it, after every host played."""
    parts = [part_dir(store_dir, i) for i in range(process_count)]
    added = 0
    for part in parts:
        if not (part / STORE_FILE).is_file():
            continue
        with TrajectoryStore(part) as reader:
            groups = reader.groups()
            with StoreWriter(store_dir, flush_every_tasks=max(1, len(groups)), flush_every_s=1e9,
                             policy=reader.policy, provenance=reader.provenance) as out:
                done = out.finished_task_keys()
                for key, group in sorted(groups.items()):
                    if key not in done:
                        out.add_group([(traj, reader.steps(traj)) for traj in group])
                        added += 1
    for part in parts:  # after every part is committed to the store: a kill before here loses nothing
        storage.remove_tree(part)
    if parts and not storage.is_remote(parts[0]) and parts[0].parent.exists():
        parts[0].parent.rmdir()  # (a bucket has no folders: its last object gone, the folder is gone)
    return added
