"""Workers driving a remote Chromium over CDP (WorkerConfig.cdp_endpoints): a Chromium the test starts with
--remote-debugging-port on 127.0.0.1, killed mid-episode and restarted on the same port."""
import asyncio
import time

import pytest

from rmsweb_jax.suites.live import LiveSuite
from rmsweb_jax.web.actions import RELATIVE, Action
from rmsweb_jax.web.browser import EndpointDown, marked_pids
from rmsweb_jax.web.episode import EpisodeRequest
from rmsweb_jax.web.pool import AsyncWorkerPool
from rmsweb_jax.web.worker import WorkerConfig
from tests.web.recorded_site import RecordedSite, SiteSuite, site_policy
from tests.web.remote_chromium import START_S, RemoteChromium, free_port

pytestmark = pytest.mark.browser


@pytest.fixture()
def remote(tmp_path):
    browser = RemoteChromium(free_port(), tmp_path / "profile")
    browser.start()
    yield browser
    browser.kill()


def test_a_remote_browser_killed_mid_episode_and_restarted_delivers_every_episode_once(loop, remote):
    killed = []
    inner = site_policy()

    def policy(history):
        # Episode 2's first run: kill the remote browser at its second step, start it again on the same port.
        if history.request.request_id == "recorded-site#2" and history.attempt == 1 and len(history.actions) == 1:
            killed.append(remote.process.pid)
            remote.kill()
            remote.start()
        return inner(history)

    async def go(task):
        config = WorkerConfig(step_timeout_s=10, cdp_endpoints=(remote.http,), launch_timeout_s=10)
        async with AsyncWorkerPool(SiteSuite(viewport=(640, 480), settle_s=0.05), 1, config) as pool:
            assert marked_pids(pool.marker) == []  # no local browser: the worker drives the remote one
            requests = [EpisodeRequest(task, seed=s, max_steps=20) for s in range(3)]
            return [e async for e in pool.run(requests, policy)], pool.workers[0].restarts

    with RecordedSite() as site:
        episodes, restarts = loop.run(go(site.task()), 180)
    assert sorted(e.request.request_id for e in episodes) == [f"recorded-site#{s}" for s in range(3)]
    assert all(e.complete and e.success for e in episodes), [(e.status, e.faults) for e in episodes]
    rerun = {e.request.request_id: e for e in episodes}["recorded-site#2"]
    assert killed and rerun.attempts == 2 and len(rerun.faults) == 1 and restarts == 1


def test_the_guard_holds_on_a_remote_browser(loop, remote, page_task, page_server):
    """test_worker.py's blocked navigation, on the remote browser: a link to the test server under a host
    name off the allowlist is refused by the guard's interceptor and reported; the task page stays."""
    async def go():
        config = WorkerConfig(step_timeout_s=10, cdp_endpoints=(remote.http,))
        async with AsyncWorkerPool(LiveSuite(viewport=(640, 480), settle_s=0.1), 1, config) as pool:
            worker = pool.workers[0]
            obs = await worker.reset(page_task("controls.html"), 0)
            link = next(e for e in obs.elements if e.role == "link" and e.name == "Off site")
            action = Action.click(*RELATIVE.from_css(link.bbox.center, obs.viewport))
            blocked, errors = [], []
            deadline = time.monotonic() + START_S
            while not (blocked and errors):  # the refusal lands a moment after the click
                after, _, info = await worker.step(action)
                blocked += after.blocked_urls
                errors += [info["error"]] if info["error"] else []
                assert time.monotonic() < deadline, f"no blocked navigation within {START_S:g} s: {blocked}, {errors}"
                action = Action("wait", seconds=0.2)
            return after, blocked, errors

    after, blocked, errors = loop.run(go(), 120)
    assert blocked == [f"http://localhost:{page_server.port}/other.html"] and errors[0].startswith("navigation blocked")
    assert after.title == "Controls" and after.url.endswith("/controls.html")


def test_an_endpoint_that_stays_down_is_named(loop):
    port = free_port()  # nothing listens there

    async def go():
        config = WorkerConfig(cdp_endpoints=(f"http://127.0.0.1:{port}",), launch_timeout_s=2, launch_attempts=2)
        async with AsyncWorkerPool(SiteSuite(), 1, config, start_timeout_s=30):
            pass

    with pytest.raises(EndpointDown, match=f"remote Chromium at http://127.0.0.1:{port} did not answer in 2 attempts"):
        loop.run(go(), 60)


def _collect_config(endpoint: str):
    from configs.common import base_config
    config = base_config()
    c = config.collect
    c.tasks, c.num_seeds, c.attempts, c.workers, c.progress, c.flush_every_tasks = "click-test", 2, 1, 1, False, 1
    config.web.cdp_endpoint = endpoint
    return config


def test_the_collect_stage_plays_on_the_remote_browser(remote, tmp_path):
    from rmsweb_jax.stages import collect as stage
    report = stage.run(_collect_config(remote.http), tmp_path / "remote")
    assert report["trajectories"] == 2 and report["browser_faults"]["faults"] == 0
    remote.kill()  # the same run against a browser that is gone: the stage's workers were the remote's
    with pytest.raises(EndpointDown, match=f"remote Chromium at {remote.http}"):
        stage.run(_collect_config(remote.http), tmp_path / "gone")
    remote.start()


def test_mining_rollouts_play_on_the_remote_browser(remote, tmp_path):
    """mine.rollouts plays its task groups in the browsers web.cdp_endpoint names, as collect does."""
    from rmsweb_jax.judges.from_config import judge_from_config
    from rmsweb_jax.mining.rollouts import run_rollouts
    from rmsweb_jax.stages.collect import collect_tasks, make_policy
    from rmsweb_jax.suites.from_config import suite_from_config

    def play(config, workdir):
        tasks = collect_tasks(config.collect)
        policy = make_policy(config, workdir, [t.id for t in tasks])
        try:
            with suite_from_config(config.collect) as suite:
                return run_rollouts(config, workdir, policy, [(t, 0) for t in tasks], suite=suite,
                                    judge=judge_from_config(config.collect))
        finally:
            policy.close()

    store, summary = play(_collect_config(remote.http), tmp_path / "remote")
    assert summary.collected == 1 and summary.lost_to_faults == summary.fault_reruns == 0 and store.is_dir()
    remote.kill()  # the same rollouts against a browser that is gone: they were the remote's
    with pytest.raises(EndpointDown, match=f"remote Chromium at {remote.http}"):
        play(_collect_config(remote.http), tmp_path / "gone")
    remote.start()


def test_a_malformed_endpoint_is_one_line_naming_the_key(tmp_path):
    from rmsweb_jax.errors import UserError
    from rmsweb_jax.stages import collect as stage
    with pytest.raises(UserError, match="web.cdp_endpoint '127.0.0.1:9222': expected a CDP endpoint"):
        stage.check_config(_collect_config("ws://a:1/devtools/browser/x, 127.0.0.1:9222"), tmp_path)
