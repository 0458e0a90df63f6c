"""A browser that dies while it is being relaunched (after a crash) is one more worker fault:
the episode is rerun, the worker launches again later, and the pool delivers every episode
exactly once.

Chromium is started through a two-line shell script that execs the real binary, except when
a flag file exists: then it removes the flag and SIGKILLs itself before Chromium starts, so
that one launch dies under Playwright's feet.
"""
import os
import signal
import stat
import subprocess
import sys
import time

import pytest

from rmsweb_jax.suites.live import LiveSuite
from rmsweb_jax.web.actions import Action
from rmsweb_jax.web.browser import MARKER_FLAG, LaunchTimeout, find_chromium, kill_marked, marked_pids
from rmsweb_jax.web.episode import EpisodeRequest
from rmsweb_jax.web.sync_pool import WorkerPool
from rmsweb_jax.web.worker import BrowserWorker, WorkerConfig, WorkerFault

pytestmark = pytest.mark.browser


@pytest.fixture
def dying_chromium(tmp_path):
    """Returns (executable, flag): the next launch after `flag.touch()` dies while launching."""
    flag = tmp_path / "die-on-next-launch"
    script = tmp_path / "chromium"
    script.write_text(f"#!/bin/sh\nif rm '{flag}' 2>/dev/null; then kill -9 $$; fi\nexec '{find_chromium()}' \"$@\"\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return str(script), flag


def _kill_browser(pid):
    os.killpg(pid, signal.SIGKILL)


def test_a_relaunch_that_dies_is_a_worker_fault_and_the_next_reset_launches(loop, page_task, dying_chromium):
    executable, flag = dying_chromium
    worker = BrowserWorker(LiveSuite(viewport=(400, 300), settle_s=0.0),
                           WorkerConfig(executable=executable, step_timeout_s=10))
    try:
        loop.run(worker.reset(page_task("other.html")), 60)
        first = worker.browser_pid
        flag.touch()
        _kill_browser(first)
        with pytest.raises(WorkerFault) as fault:
            loop.run(worker.step(Action("wait", seconds=0.1)), 60)
        assert not flag.exists()  # the relaunch ran and died
        assert "relaunch" in str(fault.value), fault.value
        assert worker.browser_pid is None
        obs = loop.run(worker.reset(page_task("other.html")), 60)
        assert obs.title == "Other page"
        assert worker.browser_pid not in (None, first)
        _, _, info = loop.run(worker.step(Action("wait", seconds=0.05)), 60)
        assert info["error"] is None
    finally:
        loop.run(worker.close(), 60)
    assert marked_pids(worker.marker) == []


def test_the_pool_delivers_every_episode_once_when_a_relaunch_dies(page_task, dying_chromium):
    executable, flag = dying_chromium
    requests = [EpisodeRequest(page_task("other.html"), seed=s, max_steps=3) for s in range(6)]
    killed = []

    def policy(history):
        # Seed 2's first attempt: its browser dies mid-episode and its replacement dies launching.
        if history.request.seed == 2 and history.attempt == 1 and len(history.actions) == 1:
            flag.touch()
            killed.append(pool.browser_pid(history.worker))
            _kill_browser(killed[-1])
        return Action("wait", seconds=0.05)

    with WorkerPool(LiveSuite(viewport=(400, 300), settle_s=0.0), workers=2,
                    config=WorkerConfig(executable=executable, step_timeout_s=10), max_attempts=3) as pool:
        episodes = list(pool.run(requests, policy))
        assert len(marked_pids(pool.marker)) == 2  # the worker launched again on its next episode
    assert sorted(e.request.request_id for e in episodes) == sorted(r.request_id for r in requests)
    assert not flag.exists() and len(killed) == 1
    for e in episodes:
        assert e.complete and len(e.actions) == 3, (e.request.request_id, e.faults)
        if e.request.seed == 2:
            assert e.attempts == 2 and len(e.faults) == 1 and "relaunch" in e.faults[0], e.faults
            assert [o.step for o in e.observations] == [0, 1, 2, 3]
        else:
            assert e.attempts == 1 and e.faults == ()


@pytest.fixture
def hanging_chromium(tmp_path):
    """Returns (executable, flag): while `flag` exists, a launch hangs (a shell that never starts
    Chromium, with the launch's arguments, marker included, on its command line) and removes the flag."""
    flag = tmp_path / "hang-on-next-launch"
    script = tmp_path / "chromium"
    script.write_text(f"#!/bin/bash\nif rm '{flag}' 2>/dev/null; then while true; do sleep 1; done; fi\n"
                      f"exec '{find_chromium()}' \"$@\"\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return str(script), flag


def test_a_launch_that_hangs_is_killed_and_the_next_attempt_starts_the_browser(loop, page_task, hanging_chromium):
    executable, flag = hanging_chromium
    flag.touch()
    worker = BrowserWorker(LiveSuite(viewport=(320, 240), settle_s=0.0),
                           WorkerConfig(executable=executable, launch_timeout_s=4, launch_attempts=2))
    try:
        loop.run(worker.start(), 60)
        assert not flag.exists()  # the first launch hung: it removed the flag
        pids = marked_pids(worker.marker, exact=True)
        assert len(pids) == 1  # the hung shell was killed; only the browser of the second launch is left
        with open(f"/proc/{pids[0]}/cmdline", "rb") as f:
            assert b"bash" not in f.read().split(b"\0")[0]
        obs = loop.run(worker.reset(page_task("other.html")), 30)
        assert obs.url.endswith("other.html")
    finally:
        loop.run(worker.close(), 30)
    assert marked_pids(worker.marker, exact=True) == []


def test_a_launch_that_hangs_every_time_fails_naming_the_attempts_and_leaves_nothing(loop, tmp_path):
    script = tmp_path / "chromium"
    script.write_text("#!/bin/bash\nwhile true; do sleep 1; done\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    worker = BrowserWorker(LiveSuite(), WorkerConfig(executable=str(script), launch_timeout_s=2, launch_attempts=2))
    try:
        with pytest.raises(LaunchTimeout, match=r"did not start within 2 s in 2 attempts"):
            loop.run(worker.start(), 60)
        assert marked_pids(worker.marker, exact=True) == []
    finally:
        loop.run(worker.close(), 30)


def test_kill_marked_returns_only_when_nothing_marked_is_left_alive():
    # A marked process whose child, forked without exec (so it carries the marker too), leaves the process group
    # (Chromium forks its zygote and helpers the same way): killing the browser's group misses the child, and both
    # stay listed until the kernel has torn the killed one down (longer on a loaded machine, as on CI). Right after
    # kill_marked nothing carrying the marker may be alive. (A kill that did not look again failed here every time.)
    marker = f"kill-wait-{os.getpid()}"
    forking = ("import os, time\n"
               "if os.fork() == 0:\n"
               "    os.setsid()\n"
               "time.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, "-c", forking, MARKER_FLAG + marker], start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while len(_marked_processes(marker)) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(_marked_processes(marker)) == 2, "the marked process and its child never both started"
        assert kill_marked(marker, exact=True), "the marked process was never seen"
        assert marked_pids(marker, exact=True) == [], "still alive after kill_marked"
    finally:
        kill_marked(marker, exact=True)
        proc.kill()
        proc.wait()


def _marked_processes(marker: str) -> list[int]:
    """Returns every live process carrying `marker` (children of marked processes included, unlike marked_pids)."""
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if (MARKER_FLAG + marker).encode() in f.read().split(b"\0"):
                    found.append(int(entry))
        except OSError:
            continue
    return found
