"""Checks a trajectory store, and repairs it by moving damaged flushes to quarantine.

    python -m rmsweb_jax.collect.store --check DIR    # exit 0: intact, 1: damaged, 2: cannot check
    python -m rmsweb_jax.collect.store --repair DIR   # damaged flushes -> DIR/quarantine/<time>/

The check reads every byte: each shard against its flush's commit marker (size, ArrayRecord's
status, record count, sha256). The repair holds the writer lock and moves each damaged flush's
files (shards first, the marker last: an interrupted repair leaves a marker whose shards are
missing, which the next repair moves too) into one quarantine folder, with README.json saying what
was wrong and which task groups the flush held. Nothing is deleted. The groups of a quarantined
flush are no longer committed, so the next collect run over the store collects them again.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import time

from rmsweb_jax import storage
from rmsweb_jax.collect.records import StepRecord, TrajectoryRecord
from rmsweb_jax.collect.store_layout import (QUARANTINE, Damage, Flush, StoreError, describe, find_damage,
                                             load_flushes, lock_store, orphan_files, pull_store, read_all, read_meta,
                                             write_atomic)
from rmsweb_jax.durable import fsync_dir
from rmsweb_jax.errors import UserError


def check(directory: pathlib.Path) -> tuple[dict[int, Flush], list[Damage], list[str]]:
    """Returns (intact flushes, damaged flushes, leftovers of an interrupted flush) of the store,
    reading every byte."""
    meta = read_meta(directory)
    flushes, damage = load_flushes(directory, meta)
    damage += find_damage(directory, flushes, full=True)
    bad = {d.flush.seq for d in damage}
    intact = {seq: f for seq, f in flushes.items() if seq not in bad}
    return intact, sorted(damage, key=lambda d: d.flush.seq), orphan_files(directory, meta)


def task_groups(directory: pathlib.Path, flush: Flush) -> list[tuple[str, int]] | None:
    """Returns the (task id, seed) groups a damaged flush held: from its marker, else from whichever
    of its shards still reads; None when none says."""
    if flush.task_groups:
        return list(flush.task_groups)
    for shard, decode in ((flush.trajectories, TrajectoryRecord.from_bytes), (flush.steps, StepRecord.from_bytes)):
        if shard and (directory / shard["file"]).is_file():
            try:
                return list(dict.fromkeys(decode(d).key for d in read_all(directory / shard["file"])))
            except (StoreError, ValueError):  # unreadable: the other shard may still say
                continue
    return None


def quarantine(directory: pathlib.Path, damage: list[Damage]) -> tuple[pathlib.Path, list[dict]]:
    """Moves the damaged flushes' files into a new DIR/quarantine/<UTC time>/ with README.json;
    returns (that folder, README.json's entry per flush)."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    folder, n = directory / QUARANTINE / stamp, 1
    while folder.exists():
        n += 1
        folder = directory / QUARANTINE / f"{stamp}-{n}"
    folder.mkdir(parents=True)
    entries = [{"seq": d.flush.seq, "files": [f for f in d.flush.files() if (directory / f).exists()],
                "problems": list(d.problems), "task_groups": task_groups(directory, d.flush),
                "marker": d.flush.to_json()} for d in damage]
    readme = {"store": str(directory), "quarantined_at": stamp, "why": (
        "these flushes of the trajectory store were damaged (see problems); their files were moved here as found. "
        "Their task groups are no longer in the store: the next collect run over it collects them again "
        "(task_groups null: the damage hides which groups they were)."), "flushes": entries}
    write_atomic(folder / "README.json", json.dumps(readme, indent=2).encode())
    for entry in entries:
        for name in entry["files"]:
            os.replace(directory / name, folder / name)
    fsync_dir(folder)
    fsync_dir(directory)
    return folder, entries


def _print_check(directory: pathlib.Path) -> int:
    intact, damage, orphans = check(directory)
    records = sum(f.trajectories.get("records") or 0 for f in intact.values())
    steps = sum((f.steps or {}).get("records") or 0 for f in intact.values())
    print(f"{directory}: {len(intact)} flushes intact ({records} trajectories, {steps} steps)")
    if orphans:
        print(f"leftovers of an interrupted flush (the next writer removes them): {', '.join(orphans)}")
    if damage:
        print(describe(directory, damage))
        return 1
    return 0


def _repair(directory: pathlib.Path) -> int:
    read_meta(directory)  # a folder without a store gets no lock file
    lock = lock_store(directory)  # no writer may commit while flushes move
    try:
        intact, damage, _ = check(directory)
        if not damage:
            print(f"{directory}: nothing to repair: {len(intact)} flushes intact")
            return 0
        print(describe(directory, damage).rsplit("\n", 1)[0])
        folder, entries = quarantine(directory, damage)
        for entry in entries:
            groups = entry["task_groups"]
            names = ", ".join(f"{t}/{s}" for t, s in groups) if groups else "unknown (see README.json)"
            print(f"moved flush {entry['seq']} ({', '.join(entry['files'])}) to {folder}; task groups to collect "
                  f"again: {names}")
        intact, damage, _ = check(directory)
        if damage:  # cannot happen unless the disk changes under us: say so rather than claim success
            raise StoreError(describe(directory, damage))
        print(f"{directory} now holds {len(intact)} intact flushes; README: {folder / 'README.json'}")
        return 0
    finally:
        lock.close()


def main(argv: list[str] | None = None) -> int:
    """Runs the check or the repair of the command line; returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m rmsweb_jax.collect.store",
                                     description="Check a trajectory store, or quarantine its damaged flushes.")
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--check", metavar="DIR", help="read every byte; exit 1 when a flush is damaged")
    action.add_argument("--repair", metavar="DIR", help="move damaged flushes to DIR/quarantine/<time>/")
    args = parser.parse_args(argv)
    try:
        if args.check:  # a gs:// store is checked in its local mirror
            return _print_check(pull_store(args.check))
        storage.refuse_remote(args.repair, "--repair")  # quarantining renames files: repair a local copy
        return _repair(pathlib.Path(args.repair))
    except (StoreError, UserError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
