"""Faults on real Chromium: killed browsers, hung pages, exceptions and Ctrl-C."""
import os
import queue
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from rmsweb_jax.suites.live import LiveSuite
from rmsweb_jax.suites.miniwob import MiniWoBSuite, load_miniwob_tasks
from rmsweb_jax.web.actions import RELATIVE, Action
from rmsweb_jax.web.browser import marked_pids
from rmsweb_jax.web.episode import EpisodeRequest
from rmsweb_jax.web.sync_pool import WorkerPool
from rmsweb_jax.web.worker import BrowserWorker, WorkerConfig, WorkerFault

pytestmark = pytest.mark.browser
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Upper bound on waiting for a browser process or a subprocess: only reached when the behaviour
# under test is broken.
WAIT_S = 60.0
# Step timeouts of the hang tests: a hung step takes this long to fault, and a healthy step on a
# loaded 2-core machine (an action plus a screenshot, ~1 s at load 20) stays well inside it.
STEP_TIMEOUT_S = 6


def click_named(obs, role, name):
    element = next(e for e in obs.elements if e.role == role and e.name == name)
    return Action.click(*RELATIVE.from_css(element.bbox.center, obs.viewport))


def enter_text_policy(history):
    """Solves miniwob.enter-text in three steps: click the field, type, click Submit."""
    obs = history.observations[0]
    word = obs.instruction.split('"')[1]
    field = next(e for e in obs.elements if e.role == "textbox")
    steps = [Action.click(*RELATIVE.from_css(field.bbox.center, obs.viewport)), Action.type_text(word),
             click_named(obs, "button", "Submit")]
    return steps[len(history.actions)]


def wait_gone(marker, timeout_s=WAIT_S):
    deadline = time.monotonic() + timeout_s
    while marked_pids(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    return marked_pids(marker)


def test_killed_browser_mid_episode_is_rerun_and_delivered_once():
    tasks = {t.id: t for t in load_miniwob_tasks()}
    requests = [EpisodeRequest(tasks["miniwob.enter-text"], seed=s, max_steps=5) for s in range(6)]
    killed = {}

    def policy(history):
        # Kill this worker's Chromium after the first action of seed 3's first attempt.
        if history.request.seed == 3 and history.attempt == 1 and len(history.actions) == 1:
            killed["pid"] = pool.browser_pid(history.worker)
            os.kill(killed["pid"], signal.SIGKILL)
        return enter_text_policy(history)

    with MiniWoBSuite() as suite, WorkerPool(suite, workers=2) as pool:
        episodes = list(pool.run(requests, policy))
        assert len(marked_pids(pool.marker)) == 2  # the killed browser was replaced
        assert killed["pid"] not in marked_pids(pool.marker)
    assert wait_gone(pool.marker) == []

    ids = [e.request.request_id for e in episodes]
    assert sorted(ids) == sorted(r.request_id for r in requests)  # each exactly once
    for e in episodes:
        assert e.complete and e.reward == 1.0 and len(e.actions) == 3, e.request.request_id
        if e.request.seed == 3:
            assert e.attempts == 2 and len(e.faults) == 1 and "step 2" in e.faults[0]
            # The handed-on episode is the re-run: it starts from reset, observations step 0..3.
            assert [o.step for o in e.observations] == [0, 1, 2, 3]
        else:
            assert e.attempts == 1 and e.faults == ()


def test_page_stuck_in_a_js_loop_times_out_and_the_worker_recovers(loop, page_task):
    worker = BrowserWorker(LiveSuite(viewport=(400, 300), settle_s=0.0), WorkerConfig(step_timeout_s=STEP_TIMEOUT_S))
    try:
        obs = loop.run(worker.reset(page_task("spin_on_load.html")), 60)
        first_pid = worker.browser_pid
        started = time.monotonic()
        with pytest.raises(WorkerFault, match=f"timed out after {STEP_TIMEOUT_S}s") as fault:
            loop.run(worker.step(click_named(obs, "button", "Spin")), 120)
        # The reason names what the step was waiting on: the click (its input is acknowledged only once the
        # page's script yields) or the read of the page.
        assert re.search(r"while (performing the left_click on \S+spin_on_load.html|reading \S+spin_on_load.html)",
                         str(fault.value)), fault.value
        # Loose: the step timeout and a browser restart, not the page's endless loop.
        assert time.monotonic() - started < 90
        assert worker.restarts == 1 and worker.browser_pid not in (None, first_pid)
        obs = loop.run(worker.reset(page_task("spin_on_load.html")), 60)
        assert obs.title == "Spins"
        _, done, info = loop.run(worker.step(Action("wait", seconds=0.1)))
        assert info["error"] is None
    finally:
        loop.run(worker.close(), 60)
    assert worker.browser_pid is None


def renderer_pids(browser_pid):
    """Returns the pids of the renderer processes in a browser's process group."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                # Zygote children rewrite their command line as one string: search it whole.
                cmdline = open(f"/proc/{entry}/cmdline", "rb").read()
                if os.getpgid(int(entry)) == browser_pid and b"--type=renderer" in cmdline:
                    pids.append(int(entry))
            except OSError:
                continue
    return pids


def test_crashed_page_is_a_fault_and_the_worker_recovers(loop, page_task):
    worker = BrowserWorker(LiveSuite(viewport=(400, 300), settle_s=0.0), WorkerConfig(step_timeout_s=5))
    try:
        loop.run(worker.reset(page_task("other.html")), 60)
        renderers = renderer_pids(worker.browser_pid)
        assert renderers
        for pid in renderers:
            os.kill(pid, signal.SIGKILL)
        with pytest.raises(WorkerFault):
            loop.run(worker.step(Action("wait", seconds=0.2)), 60)
        assert worker.restarts == 1
        obs = loop.run(worker.reset(page_task("other.html")), 60)
        assert obs.title == "Other page"
    finally:
        loop.run(worker.close(), 60)


def test_pool_reports_an_always_hanging_episode_as_failed(page_task):
    suite = LiveSuite(viewport=(400, 300), settle_s=0.0)
    requests = [EpisodeRequest(page_task("spin_on_load.html"), request_id="spin", max_steps=3),
                EpisodeRequest(page_task("other.html"), request_id="calm", max_steps=2)]

    def policy(history):
        if history.request.request_id == "spin":
            return click_named(history.observation, "button", "Spin")
        return Action("wait", seconds=0.05)

    with WorkerPool(suite, workers=2, config=WorkerConfig(step_timeout_s=STEP_TIMEOUT_S), max_attempts=2) as pool:
        episodes = {e.request.request_id: e for e in pool.run(requests, policy)}
    assert wait_gone(pool.marker) == []
    spin, calm = episodes["spin"], episodes["calm"]
    assert spin.status == "failed" and spin.attempts == 2 and len(spin.faults) == 2
    assert all("timed out" in f for f in spin.faults) and spin.observations == () and spin.reward is None
    assert calm.complete and calm.truncated and len(calm.actions) == 2 and calm.attempts == 1


def test_pool_closes_its_browsers_when_the_policy_raises(page_task):
    def policy(history):
        raise ValueError("policy bug")

    with pytest.raises(ValueError, match="policy bug"):
        with WorkerPool(LiveSuite(viewport=(400, 300)), workers=2) as pool:
            assert len(marked_pids(pool.marker)) == 2
            list(pool.run([EpisodeRequest(page_task("other.html"), seed=s) for s in range(4)], policy))
    assert wait_gone(pool.marker) == []


@pytest.mark.slow
def test_pool_closes_its_browsers_on_ctrl_c(tmp_path):
    script = tmp_path / "run_pool.py"
    script.write_text(textwrap.dedent("""
        import sys, threading, time
        from rmsweb_jax.suites.miniwob import MiniWoBSuite, load_miniwob_tasks
        from rmsweb_jax.web.actions import Action
        from rmsweb_jax.web.episode import EpisodeRequest
        from rmsweb_jax.web.sync_pool import WorkerPool
        tasks = {t.id: t for t in load_miniwob_tasks()}
        printing = threading.Lock()  # two workers step at once: a print's text and its newline are two writes
        def policy(history):
            with printing:
                print("stepping", flush=True)  # the test interrupts once the episodes are under way
            time.sleep(0.05)
            return Action("wait", seconds=0.05)
        with MiniWoBSuite() as suite, WorkerPool(suite, workers=2) as pool:
            print(pool.marker, flush=True)
            requests = [EpisodeRequest(tasks["miniwob.click-button"], seed=s, max_steps=1000) for s in range(8)]
            for episode in pool.run(requests, policy):
                pass
    """))
    stderr = tmp_path / "stderr.txt"
    with open(stderr, "w") as err_file:
        proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=err_file, text=True,
                                cwd=REPO)
    lines = queue.Queue()  # the child's stdout lines, then None at its end

    def read_lines():
        for line in proc.stdout:
            lines.put(line.strip())
        lines.put(None)

    threading.Thread(target=read_lines, daemon=True).start()
    try:
        marker = lines.get(timeout=WAIT_S)
        assert marker, stderr.read_text()
        assert len(marked_pids(marker)) == 2
        assert lines.get(timeout=WAIT_S) == "stepping", stderr.read_text()  # in the middle of the episodes
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=WAIT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
    err = stderr.read_text()
    assert proc.returncode != 0 and "KeyboardInterrupt" in err, err
    assert wait_gone(marker) == []
