"""Acceptance: SIGKILL the collect stage (the absl entry point, demo config) mid-run, restart it:
every finished task group is in the store exactly once, and the rerun finishes the rest. And a
store with damaged shards: the rerun stops with a StoreError naming them and the repair command;
after the repair, the rerun collects exactly the quarantined task groups."""
import collections
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from array_record.python.array_record_module import ArrayRecordReader

from rmsweb_jax.collect.records import TrajectoryRecord
from rmsweb_jax.collect.report import compute_report
from rmsweb_jax.collect.store import STEPS, TRAJECTORIES, TrajectoryStore, shard_name
from rmsweb_jax.web.browser import kill_marked, marked_pids

pytestmark = pytest.mark.browser

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TASKS = "click-button,click-checkboxes,click-link,click-option,enter-text,login-user,click-tab,choose-list"
SEEDS = 3
K = 3


def _command(workdir, tasks=TASKS, seeds=SEEDS):
    return [sys.executable, "-m", "rmsweb_jax.main", "--config=configs/demo.py", f"--workdir={workdir}",
            "--config.stages=collect", f"--config.collect.tasks={tasks}", f"--config.collect.num_seeds={seeds}",
            f"--config.collect.attempts={K}", "--config.collect.flush_every_tasks=2", "--config.collect.progress=False"]


def _digest(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.slow
def test_sigkill_mid_run_then_resume_loses_and_duplicates_nothing(tmp_path):
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=1", JAX_PLATFORMS="cpu")
    log = open(tmp_path / "first.log", "w+")
    proc = subprocess.Popen(_command(tmp_path), cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    store_dir = tmp_path / "store"
    marker = None
    try:
        deadline = time.monotonic() + 240
        # Kill once two flushes are committed: some groups are on disk, many are not yet run.
        while not (store_dir / shard_name(TRAJECTORIES, 2)).exists():
            assert proc.poll() is None, f"collect exited early:\n{(tmp_path / 'first.log').read_text()[-3000:]}"
            assert time.monotonic() < deadline, "no second flush within 240 s"
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(timeout=30) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.flush()
        found = re.search(r"browser pool marker ([0-9a-f]+)", (tmp_path / "first.log").read_text())
        marker = found.group(1) if found else None
        if marker:  # the killed process's browsers, if any outlived it (and only those)
            time.sleep(2.0)
            left = marked_pids(marker)
            kill_marked(marker)
    assert marker, "the first run never logged its browser pool marker"

    before = TrajectoryStore(store_dir)
    committed = {p.name: _digest(p) for p in before.trajectory_shards() + before.step_shards()}
    keys_before = before.finished_task_keys()
    total = len(TASKS.split(",")) * SEEDS
    assert 2 <= len(keys_before) < total, f"killed too late or too early: {len(keys_before)} of {total} groups"

    second = subprocess.run(_command(tmp_path), cwd=REPO, env=env, capture_output=True, text=True, timeout=400)
    assert second.returncode == 0, second.stdout[-2000:] + second.stderr[-3000:]
    report = json.loads((tmp_path / "collect_report.json").read_text())
    assert report["run"]["skipped"] == len(keys_before)
    assert report["run"]["collected"] == total - len(keys_before)

    after = TrajectoryStore(store_dir)
    # What was committed before the kill is still there, byte for byte.
    assert {name: _digest(store_dir / name) for name in committed} == committed
    trajectories = list(after.trajectories())
    attempts = collections.Counter((t.task_id, t.seed, t.attempt) for t in trajectories)
    assert max(attempts.values()) == 1, [k for k, c in attempts.items() if c > 1]  # nothing twice
    groups = collections.defaultdict(list)
    for t in trajectories:
        groups[(t.task_id, t.seed)].append(t.attempt)
    assert len(groups) == total and set(groups) >= keys_before  # nothing lost, everything finished
    for key, numbers in groups.items():
        assert sorted(numbers) == list(range(1, len(numbers) + 1)), key
    for t in trajectories:
        assert len(after.steps(t)) == t.num_steps
    assert report["tasks"] == total and report["trajectories"] == len(trajectories)
    print(f"killed after {len(keys_before)}/{total} groups; browsers left by the kill: {left}")


def _groups_of(shard):
    """Returns the (task id, seed) groups of a trajectories shard, read with ArrayRecord directly."""
    reader = ArrayRecordReader(str(shard))
    try:
        return {TrajectoryRecord.from_bytes(d).key for d in reader.read_all()}
    finally:
        reader.close()


@pytest.mark.slow
def test_damaged_shards_stop_the_rerun_until_repaired_then_exactly_their_groups_are_collected_again(tmp_path):
    tasks, seeds = "click-button,click-link,enter-text,click-tab", 2
    total = len(tasks.split(",")) * seeds
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=1", JAX_PLATFORMS="cpu")
    command = _command(tmp_path, tasks, seeds)
    first = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=400)
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-3000:]
    store_dir = tmp_path / "store"
    flushes = TrajectoryStore(store_dir).committed_flushes()
    assert len(flushes) >= 3, flushes
    held = {seq: _groups_of(store_dir / shard_name(TRAJECTORIES, seq)) for seq in flushes}
    # The last trajectories shard and the first steps shard cut at a 64 KiB boundary.
    damaged = [store_dir / shard_name(TRAJECTORIES, flushes[-1]), store_dir / shard_name(STEPS, flushes[0])]
    for path in damaged:
        assert path.stat().st_size > 65536
        path.write_bytes(path.read_bytes()[:65536])
    report_path = tmp_path / "collect_report.json"
    first_report = report_path.read_bytes()

    blocked = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=400)
    assert blocked.returncode != 0, blocked.stdout[-2000:]
    assert f"the trajectory store at {store_dir} has 2 damaged flush(es)" in blocked.stderr, blocked.stderr[-3000:]
    for path in damaged:
        assert f"{path}: truncated: 65536 of " in blocked.stderr, blocked.stderr[-3000:]
    assert f"python -m rmsweb_jax.collect.store --repair {store_dir}" in blocked.stderr
    assert report_path.read_bytes() == first_report  # no report over a damaged store
    assert not (store_dir / shard_name(TRAJECTORIES, flushes[-1] + 1)).exists()  # and nothing collected

    store_command = [sys.executable, "-m", "rmsweb_jax.collect.store"]
    check = subprocess.run(store_command + ["--check", str(store_dir)], cwd=REPO, capture_output=True, text=True,
                           timeout=120)
    assert check.returncode == 1 and all(path.name in check.stdout for path in damaged), check.stdout + check.stderr
    repair = subprocess.run(store_command + ["--repair", str(store_dir)], cwd=REPO, capture_output=True, text=True,
                            timeout=120)
    assert repair.returncode == 0, repair.stdout + repair.stderr
    (folder,) = (store_dir / "quarantine").iterdir()
    readme = json.loads((folder / "README.json").read_text())
    quarantined = {tuple(k) for entry in readme["flushes"] for k in entry["task_groups"]}
    assert quarantined == held[flushes[0]] | held[flushes[-1]]
    assert {entry["seq"] for entry in readme["flushes"]} == {flushes[0], flushes[-1]}

    rerun = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=400)
    assert rerun.returncode == 0, rerun.stdout[-2000:] + rerun.stderr[-3000:]
    report = json.loads(report_path.read_text())
    assert report["run"]["collected"] == len(quarantined) and report["run"]["skipped"] == total - len(quarantined)
    after = TrajectoryStore(store_dir, verify="full")
    new = [seq for seq in after.committed_flushes() if seq > flushes[-1]]
    assert set().union(*(_groups_of(store_dir / shard_name(TRAJECTORIES, seq)) for seq in new)) == quarantined
    trajectories = list(after.trajectories())
    assert len({t.key for t in trajectories}) == total
    assert max(collections.Counter((t.task_id, t.seed, t.attempt) for t in trajectories).values()) == 1
    for t in trajectories:
        assert len(after.steps(t)) == t.num_steps
    recount = json.loads(json.dumps(compute_report(after, attempts=K, success_rule=report["success_rule"])))
    assert {key: report[key] for key in recount} == recount
    final_check = subprocess.run(store_command + ["--check", str(store_dir)], cwd=REPO, capture_output=True, text=True,
                                 timeout=120)
    assert final_check.returncode == 0, final_check.stdout
    print(f"quarantined {len(quarantined)} of {total} groups in flushes {sorted(e['seq'] for e in readme['flushes'])}; "
          f"collected again in flushes {new}")
