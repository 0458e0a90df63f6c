"""Endpoint failover (AsyncWorkerPool over several CDP endpoints): an endpoint that stays down is named, and its
episodes, the one in flight and the ones still to come, run on the other endpoints, each delivered once.
The remote browsers are Chromiums the test starts with --remote-debugging-port on 127.0.0.1."""
import threading

import pytest

from rmsweb_jax.web.episode import EpisodeRequest
from rmsweb_jax.web.pool import AllEndpointsDown, AsyncWorkerPool
from rmsweb_jax.web.worker import WorkerConfig
from tests.web.recorded_site import RecordedSite, SiteSuite, site_policy
from tests.web.remote_chromium import RemoteChromium, free_port

pytestmark = pytest.mark.browser
# A refused connection fails at once: the reconnection gives up after its one backoff (0.5 s). The step's
# bound only matters on a loaded machine (CI runs the TPU compiles beside this test): a live browser's step
# that timed out there is a second, unrelated fault.
CONFIG = dict(step_timeout_s=60, launch_timeout_s=5, launch_attempts=2)


@pytest.fixture()
def remotes(tmp_path):
    browsers = [RemoteChromium(free_port(), tmp_path / f"profile{i}") for i in range(2)]
    for browser in browsers:
        browser.start()
    yield browsers
    for browser in browsers:
        browser.kill()


def test_an_endpoint_killed_for_good_mid_run_moves_its_episodes_to_the_live_one(loop, remotes):
    dying, living = remotes
    inner = site_policy()
    lock = threading.Lock()
    runs = {}  # (request id, run) -> the worker slots its steps were asked on
    killed = []

    def policy(history):
        with lock:
            runs.setdefault((history.request.request_id, history.attempt), set()).add(history.worker)
            # Worker 0 (the first endpoint), its first episode's second step: its browser dies for good.
            if history.worker == 0 and len(history.actions) == 1 and not killed:
                dying.kill()
                killed.append((history.request.request_id, history.attempt))
        return inner(history)

    async def go(task):
        config = WorkerConfig(cdp_endpoints=(dying.http, living.http), **CONFIG)
        async with AsyncWorkerPool(SiteSuite(viewport=(640, 480), settle_s=0.05), 2, config) as pool:
            requests = [EpisodeRequest(task, seed=s, max_steps=20) for s in range(6)]
            return [e async for e in pool.run(requests, policy)], dict(pool.down_endpoints)

    with RecordedSite() as site:
        episodes, down = loop.run(go(site.task()), 120)
    ids = [e.request.request_id for e in episodes]
    assert sorted(ids) == [f"recorded-site#{s}" for s in range(6)]  # every episode once, none twice
    assert all(e.complete and e.success for e in episodes), [(e.request.request_id, e.status, e.faults)
                                                             for e in episodes]
    assert list(down) == [dying.http] and "did not answer" in down[dying.http]
    (moved_id, lost_run), = killed
    moved = {e.request.request_id: e for e in episodes}[moved_id]
    assert moved.attempts == lost_run + 1 and len(moved.faults) == 1 and dying.http in moved.faults[0]
    assert runs[(moved_id, lost_run + 1)] == {1}  # the moved run played on the live endpoint's worker
    lost_at = list(runs).index((moved_id, lost_run))
    later = [key for key in list(runs)[lost_at + 1:] if key != (moved_id, lost_run)]
    assert later and all(runs[key] == {1} for key in later), runs  # nothing ran on the dead endpoint after
    assert sum(e.faults != () for e in episodes) == 1, [(e.request.request_id, e.faults) for e in episodes if e.faults]


def test_with_every_endpoint_down_the_run_fails_naming_them(loop, remotes):
    def policy(history):
        for browser in remotes:  # both die at the first step asked
            browser.kill()
        return site_policy()(history)

    async def go(task):
        config = WorkerConfig(cdp_endpoints=tuple(b.http for b in remotes), **CONFIG)
        async with AsyncWorkerPool(SiteSuite(viewport=(640, 480), settle_s=0.05), 2, config) as pool:
            return [e async for e in pool.run([EpisodeRequest(task, seed=s, max_steps=20) for s in range(4)], policy)]

    with RecordedSite() as site, pytest.raises(AllEndpointsDown) as down:
        loop.run(go(site.task()), 120)
    message = str(down.value)
    assert message.startswith("every remote Chromium of the pool is down")
    assert all(b.http in message for b in remotes), message


def test_an_endpoint_down_from_the_start_leaves_its_episodes_to_the_live_one(loop, remotes):
    live = remotes[0]
    remotes[1].kill()
    gone = remotes[1].http

    async def go(task):
        config = WorkerConfig(cdp_endpoints=(gone, live.http), **CONFIG)
        async with AsyncWorkerPool(SiteSuite(viewport=(640, 480), settle_s=0.05), 2, config) as pool:
            requests = [EpisodeRequest(task, seed=s, max_steps=20) for s in range(3)]
            return [e async for e in pool.run(requests, site_policy())], dict(pool.down_endpoints)

    with RecordedSite() as site:
        episodes, down = loop.run(go(site.task()), 120)
    assert sorted(e.request.request_id for e in episodes) == [f"recorded-site#{s}" for s in range(3)]
    assert all(e.complete and e.success and e.faults == () for e in episodes)
    assert list(down) == [gone]
