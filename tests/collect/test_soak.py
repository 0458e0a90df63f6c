"""Soak: the retry collector over the browser pool (ScriptedTeacher, MiniWoB++, real Chromium)
runs a few hundred episodes while a thread SIGKILLs one of its browsers every few dozen policy
steps (steps, not seconds: a fast machine must see as many kills as a slow one), and once kills a replacement browser while it is being launched. Every task group reaches the store
exactly once, and the report equals a recount of the stored records."""
import collections
import os
import random
import threading
import time

import pytest

from rmsweb_jax.agents.teacher import MistakeConfig, ScriptedTeacher
from rmsweb_jax.collect.records import FAULT_JUDGE
from rmsweb_jax.collect.report import compute_report
from rmsweb_jax.collect.retries import RetryCollector
from rmsweb_jax.collect.store import TrajectoryStore
from rmsweb_jax.judges.programmatic import ProgrammaticJudge
from rmsweb_jax.suites.miniwob import MiniWoBSuite, load_miniwob_tasks
from rmsweb_jax.web.browser import MARKER_FLAG, marked_pids
from tests.collect.wrapped_policy import WrappedPolicy
from tests.settings import collect_settings, store_writer

pytestmark = [pytest.mark.browser, pytest.mark.slow]

TASKS = ("miniwob.click-button", "miniwob.click-link", "miniwob.click-tab", "miniwob.click-test",
         "miniwob.click-test-2", "miniwob.enter-text", "miniwob.focus-text", "miniwob.click-option")
SEEDS = range(30)  # 240 task groups
K = 2
KILL_EVERY_STEPS = 40  # contexts the policy answered between two kills: ~15 kills in the run


def _ancestors(pid):
    chain = []
    while pid > 1:
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                pid = int(f.read().rsplit(b")", 1)[1].split()[1])
        except OSError:
            break
        chain.append(pid)
    return chain


def own_browsers():
    """Returns {worker marker: browser pid} for the browsers this test process started (other
    processes on the machine run browsers with markers too)."""
    out = {}
    for pid in marked_pids(""):
        if os.getpid() not in _ancestors(pid):
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                args = f.read().split(b"\0")
        except OSError:
            continue
        marker = next(a for a in args if a.startswith(MARKER_FLAG.encode()))[len(MARKER_FLAG):].decode()
        out.setdefault(marker, pid)
    return out


class Counting(WrappedPolicy):
    """The teacher, counting the steps (contexts) it has answered."""

    def __init__(self, teacher):
        super().__init__(teacher)
        self.steps = 0

    def act(self, contexts):
        self.steps += len(contexts)
        return self.inner.act(contexts)


class Killer(threading.Thread):
    """SIGKILLs a random browser of this process each time the policy has answered `every_steps`
    more steps; the second time, it also waits for that worker's replacement to appear and kills
    it at once, while it is launching."""

    def __init__(self, every_steps, policy):
        super().__init__(daemon=True)
        self.every_steps, self.policy, self.kills, self.launching_kills = every_steps, policy, [], []
        self.stop = threading.Event()
        self.rng = random.Random(0)

    def run(self):
        due = self.every_steps
        while not self.stop.wait(0.02):  # polls a counter: when a kill lands does not decide the outcome
            if self.policy.steps < due:
                continue
            due = self.policy.steps + self.every_steps
            browsers = own_browsers()
            if not browsers:
                continue
            marker = self.rng.choice(sorted(browsers))
            self._kill(browsers[marker], self.kills)
            if len(self.kills) == 2 and not self.launching_kills:
                # The replacement's process shows in /proc as soon as it is spawned, long before
                # Playwright has connected to it.
                deadline = time.monotonic() + 60
                while not self.stop.is_set() and time.monotonic() < deadline:
                    new = [p for p in marked_pids(marker, exact=True) if p != browsers[marker]]
                    if new:
                        self._kill(new[0], self.launching_kills)
                        break
                    time.sleep(0.005)

    @staticmethod
    def _kill(pid, log):
        try:
            os.killpg(pid, 9)
            log.append(pid)
        except ProcessLookupError:
            pass


def test_collect_survives_browser_kills(tmp_path):
    known = {t.id: t for t in load_miniwob_tasks()}
    tasks = [known[name] for name in TASKS]
    store_dir = tmp_path / "store"
    policy = Counting(ScriptedTeacher(MistakeConfig(wrong_element_p=0.1, seed=1), tasks=TASKS))
    killer = Killer(KILL_EVERY_STEPS, policy)
    started = time.monotonic()
    with MiniWoBSuite() as suite, store_writer(store_dir, flush_every_tasks=20) as store:
        collector = RetryCollector(suite, policy, ProgrammaticJudge(success="positive_reward"), store,
                                   collect_settings(attempts=K,
                                   workers=2, max_steps=8, pool_max_attempts=4, progress=False))
        killer.start()
        try:
            summary = collector.run(tasks, SEEDS)
        finally:
            killer.stop.set()
            killer.join(timeout=70)
    wall_s = time.monotonic() - started
    n = len(TASKS) * len(SEEDS)
    assert summary.collected == n and summary.skipped == 0
    assert len(killer.kills) >= 5 and len(killer.launching_kills) == 1, (killer.kills, killer.launching_kills)
    assert own_browsers() == {}

    reader = TrajectoryStore(store_dir)
    trajectories = list(reader.trajectories())
    groups = collections.defaultdict(list)
    for t in trajectories:
        groups[(t.task_id, t.seed)].append(t)
    assert sorted(groups) == sorted((task, seed) for task in TASKS for seed in SEEDS)  # each group once
    assert len({t.request_id for t in trajectories}) == len(trajectories)
    for group in groups.values():
        group.sort(key=lambda t: t.attempt)
        assert [t.attempt for t in group] == list(range(1, len(group) + 1))
    faults = [f for t in trajectories for f in t.faults]
    assert len(faults) >= len(killer.kills) // 2, faults  # kills landed mid-episode and were rerun
    relaunch_faults = sum("relaunch failed" in f for f in faults)
    assert relaunch_faults >= 1, faults  # the browser killed while launching was one more fault
    print(f"\nsoak: {n} groups, {len(trajectories)} attempts, {len(killer.kills)} kills "
          f"(+{len(killer.launching_kills)} while launching), {len(faults)} faults "
          f"({relaunch_faults} in a relaunch), {wall_s:.0f}s")

    report = compute_report(reader, attempts=K, success_rule="positive_reward")
    assert report["tasks"] == n and report["trajectories"] == len(trajectories)
    assert report["steps"] == sum(t.num_steps for t in trajectories) == summary.steps
    assert report["solved"] == sum(any(t.success for t in g) for g in groups.values()) == summary.solved
    assert report["solved_first"] == sum(g[0].success for g in groups.values()) == summary.solved_first
    lost = sum(t.verdict.judge == FAULT_JUDGE for t in trajectories)
    assert report["browser_faults"] == {"faults": len(faults), "attempts_lost": lost,
                                        "attempts_rerun": sum(bool(t.faults) for t in trajectories) - lost}
