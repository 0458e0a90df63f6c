"""Acceptance: SIGKILL the collect stage (the absl entry point, demo config) mid-run, restart it:
every finished task group is in the store exactly once, and the rerun finishes the rest."""
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

from rmsweb_jax.collect.store import TRAJECTORIES, TrajectoryStore, shard_name
from rmsweb_jax.web.browser import kill_marked, marked_pids

pytestmark = pytest.mark.browser

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TASKS = "click-button,click-checkboxes,click-link,click-option,enter-text,login-user,click-tab,choose-list"
SEEDS = 3
K = 3


def _command(workdir):
    return [sys.executable, "-m", "rmsweb_jax.main", "--config=configs/demo.py", f"--workdir={workdir}",
            "--config.stages=collect", f"--config.collect.tasks={TASKS}", f"--config.collect.num_seeds={SEEDS}",
            f"--config.collect.attempts={K}", "--config.collect.flush_every_tasks=2", "--config.collect.progress=False"]


def _digest(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


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
