"""Damaged store shards (real files written by the real StoreWriter, then truncated or bit-flipped):
named in a StoreError on open, never read as fewer records, quarantined by the repair command so
their task groups are collected again."""
import json
import os
import re
import subprocess
import sys

import pytest

from rmsweb_jax.collect.store import STEPS, TRAJECTORIES, StoreError, TrajectoryStore, shard_name
from rmsweb_jax.collect.store_fixture import task_group
from tests.settings import store_writer

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GROUPS = 6  # two per flush: flushes 1, 2, 3


def _group(t):
    return task_group(f"t{t}", t % 2, fail_first=t % 3 == 0, viewport=(500, 240), variant=t)


def _write_store(root):
    """Writes 3 flushes of 2 task groups each; returns {flush: its (task id, seed) keys}."""
    with store_writer(root, flush_every_tasks=2, flush_every_s=3600) as store:
        for t in range(GROUPS):
            store.add_group(_group(t))
    return {seq: {(f"t{t}", t % 2) for t in (2 * seq - 2, 2 * seq - 1)} for seq in (1, 2, 3)}


def _flip(data, offset):
    damaged = bytearray(data)
    damaged[offset] ^= 0x04
    return bytes(damaged)


# Every shard is 128 KiB (ArrayRecord pads to 64 KiB blocks); offset 300 lies in the first record's chunk.
DAMAGES = {
    "cut at 64 KiB": (lambda data: data[:65536], "truncated: 65536 of 131072 bytes"),
    "cut mid-block": (lambda data: data[:len(data) - 777], "truncated: 130295 of 131072 bytes"),
    "cut to 100 bytes": (lambda data: data[:100], "truncated: 100 of 131072 bytes"),
    "emptied": (lambda data: b"", "truncated: 0 of 131072 bytes"),
    "bit flip in a record": (lambda data: _flip(data, 300), "contents changed"),
    "bit flip in the padding": (lambda data: _flip(data, 90000), "contents changed"),
}


def _cli(*args):
    from rmsweb_jax.collect.store_check import main  # the module behind `python -m rmsweb_jax.collect.store`
    return main(list(args))


def test_truncated_last_trajectories_shard_is_an_error_naming_it_not_zero_records(tmp_path):
    """The review's case: the last trajectories shard cut at a 64 KiB boundary read back as 0
    records, so a rerun collected its groups again and then failed at close with RuntimeError('')."""
    root = tmp_path / "store"
    _write_store(root)
    path = root / shard_name(TRAJECTORIES, 3)
    assert path.stat().st_size == 131072
    path.write_bytes(path.read_bytes()[:65536])
    expected = rf"(?s){re.escape(str(path))}: truncated: 65536 of 131072 bytes.*--repair {re.escape(str(root))}"
    with pytest.raises(StoreError, match=expected):
        TrajectoryStore(root)
    with pytest.raises(StoreError, match=expected):
        store_writer(root)  # what a collect rerun opens: it must not start collecting
    with pytest.raises(StoreError, match=expected):
        store_writer(root)  # the same error again: the failed open released its lock


@pytest.mark.parametrize("damage", list(DAMAGES))
@pytest.mark.parametrize("kind", [TRAJECTORIES, STEPS])
def test_damaged_shard_is_named_then_repair_quarantines_its_flush(tmp_path, capsys, kind, damage):
    root = tmp_path / "store"
    flushes = _write_store(root)
    intact = {n: (root / n).read_bytes() for n in (shard_name(STEPS, 2), shard_name(TRAJECTORIES, 2))}
    path = root / shard_name(kind, 2)
    change, problem = DAMAGES[damage]
    damaged = change(path.read_bytes())
    path.write_bytes(damaged)
    named = rf"(?s){re.escape(str(path))}: {problem}.*--repair {re.escape(str(root))}"

    # The writer (a collect rerun) verifies every byte on open.
    with pytest.raises(StoreError, match=named):
        store_writer(root)
    if damage.startswith("bit flip"):
        # Readers check sizes, reader status and record counts on open; a changed record fails when
        # read, naming the shard (not an anonymous checksum error), and close() stays quiet.
        store = TrajectoryStore(root)
        if damage == "bit flip in a record":
            with pytest.raises(StoreError, match=rf"(?s){re.escape(str(path))} is corrupt.*--repair"):
                for traj in store.trajectories():
                    store.steps(traj)
        store.close()
    else:
        with pytest.raises(StoreError, match=named):
            TrajectoryStore(root)

    assert _cli("--check", str(root)) == 1
    out = capsys.readouterr().out
    assert f"{path.name}: {problem}" in out and "flush 2" in out
    assert _cli("--repair", str(root)) == 0
    out = capsys.readouterr().out
    (quarantine,) = (root / "quarantine").iterdir()
    assert str(quarantine) in out
    # Both shards of flush 2 moved, byte for byte as found; nothing else.
    moved = {p.name: p.read_bytes() for p in quarantine.iterdir() if p.name.endswith(".arrayrecord")}
    assert moved == {**intact, path.name: damaged}
    readme = json.loads((quarantine / "README.json").read_text())
    (entry,) = readme["flushes"]
    assert entry["seq"] == 2 and any(f"{path.name}: {problem}" in p for p in entry["problems"])
    assert {tuple(k) for k in entry["task_groups"]} == flushes[2]

    store = TrajectoryStore(root)
    assert store.committed_flushes() == [1, 3]
    assert store.finished_task_keys() == flushes[1] | flushes[3]
    assert sum(1 for _ in store.trajectories()) == store.counts()["trajectories"]
    assert _cli("--check", str(root)) == 0
    # The quarantined groups are collected again, into a new flush.
    with store_writer(root, flush_every_tasks=2) as writer:
        todo = [t for t in range(GROUPS) if (f"t{t}", t % 2) not in writer.finished_task_keys()]
        assert todo == [2, 3]
        for t in todo:
            writer.add_group(_group(t))
    store = TrajectoryStore(root)
    assert store.committed_flushes() == [1, 3, 4]  # flush numbers are not reused
    assert store.finished_task_keys() == flushes[1] | flushes[2] | flushes[3]
    for traj in store.trajectories():
        assert len(store.steps(traj)) == traj.num_steps
    assert _cli("--check", str(root)) == 0


def test_read_errors_and_close_after_them_name_the_shard(tmp_path):
    """A record that fails its checksum when read: StoreError naming the file; close() after it
    raises nothing (the old close raised the reader's error again, or an empty RuntimeError)."""
    root = tmp_path / "store"
    _write_store(root)
    path = root / shard_name(TRAJECTORIES, 1)
    path.write_bytes(_flip(path.read_bytes(), 300))
    store = TrajectoryStore(root)
    with pytest.raises(StoreError, match=rf"{re.escape(str(path))} is corrupt: .*hash mismatch"):
        store.groups()
    store.close()
    with pytest.raises(StoreError, match=re.escape(str(path))):
        store.counts()  # the reader reopens, and fails the same way
    store.close()


def test_repair_refuses_while_a_writer_holds_the_store_and_check_passes_an_intact_store(tmp_path, capsys):
    root = tmp_path / "store"
    _write_store(root)
    assert _cli("--check", str(root)) == 0
    assert "3 flushes" in capsys.readouterr().out
    with store_writer(root):
        assert _cli("--repair", str(root)) == 2
        assert "another process is writing" in capsys.readouterr().err
    assert _cli("--repair", str(root)) == 0
    assert "nothing to repair" in capsys.readouterr().out
    assert not (root / "quarantine").exists()
    assert _cli("--check", str(tmp_path / "nowhere")) == 2
    assert _cli("--repair", str(tmp_path / "nowhere")) == 2
    assert "no trajectory store at" in capsys.readouterr().err and not (tmp_path / "nowhere").exists()


def test_the_documented_command_runs(tmp_path):
    """`python -m rmsweb_jax.collect.store --check/--repair DIR`, as the StoreError tells the user."""
    root = tmp_path / "store"
    _write_store(root)
    path = root / shard_name(STEPS, 3)
    path.write_bytes(path.read_bytes()[:65536])
    command = [sys.executable, "-m", "rmsweb_jax.collect.store"]
    check = subprocess.run(command + ["--check", str(root)], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert check.returncode == 1, check.stderr[-2000:]
    assert f"{path.name}: truncated: 65536 of 131072 bytes" in check.stdout
    repair = subprocess.run(command + ["--repair", str(root)], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert repair.returncode == 0, repair.stderr[-2000:]
    assert "quarantine" in repair.stdout and "t4" in repair.stdout
    assert TrajectoryStore(root).committed_flushes() == [1, 2]
    with store_writer(root, flush_every_tasks=1) as writer:  # the next flush is 4: 3 is in quarantine
        writer.add_group(_group(4))
    assert TrajectoryStore(root).committed_flushes() == [1, 2, 4]


def test_a_store_of_the_first_layout_is_checked_by_status_and_gets_markers_from_its_next_writer(tmp_path):
    """A store written before commit markers existed (no markers, no "layout" in store.json)."""
    root = tmp_path / "store"
    flushes = _write_store(root)
    meta = json.loads((root / "store.json").read_text())
    del meta["layout"]
    (root / "store.json").write_text(json.dumps(meta))
    for marker in root.glob("flush-*.json"):
        marker.unlink()
    assert TrajectoryStore(root).finished_task_keys() == set().union(*flushes.values())
    last = root / shard_name(TRAJECTORIES, 3)
    intact = last.read_bytes()
    last.write_bytes(intact[:65536])  # no recorded size to compare: ArrayRecord's status catches it
    with pytest.raises(StoreError, match=rf"(?s){re.escape(str(last))} is corrupt.*--repair"):
        TrajectoryStore(root)
    last.write_bytes(intact)
    with store_writer(root) as writer:  # verifies every record, then records the markers
        assert writer.committed_flushes() == [1, 2, 3]
    assert sorted(p.name for p in root.glob("flush-*.json")) == ["flush-000001.json", "flush-000002.json",
                                                                   "flush-000003.json"]
    last.write_bytes(intact[:len(intact) - 777])
    with pytest.raises(StoreError, match=rf"(?s){re.escape(str(last))}: truncated: 130295 of 131072 bytes"):
        TrajectoryStore(root)
