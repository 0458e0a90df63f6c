"""Record an episode on a site served by the test, stop the site, replay the episode offline from its HAR."""
import dataclasses
import io
import json

import pytest
from PIL import Image

from rmsweb_jax.web.episode import EpisodeRequest
from rmsweb_jax.web.pool import AsyncWorkerPool
from rmsweb_jax.web.recording import RECORD, REPLAY, DamagedRecording, Recording, Tape, check_recording
from rmsweb_jax.web.worker import WorkerConfig
from tests.web.recorded_site import RecordedSite, SiteSuite, site_policy

pytestmark = pytest.mark.browser


def run(loop, tape: Tape, task, policy, max_steps: int = 20, base_url: str | None = None):
    # Two attempts, as the stages give: a CI run once saw a replayed click time out (10 s, under a loaded machine's
    # TPU compiles), a browser fault the pool reruns from reset; the episode that counts still replays bit for bit.
    async def go():
        suite = SiteSuite(viewport=(640, 480), settle_s=0.05)
        if base_url is not None:  # a suite serving its own pages, as MiniWoB++'s does
            suite.base_url = base_url
        async with AsyncWorkerPool(suite, 1, WorkerConfig(step_timeout_s=20, tape=tape), max_attempts=2) as pool:
            return await pool.run_episode(0, EpisodeRequest(task, seed=0, max_steps=max_steps), policy)
    return loop.run(go(), 120)


def acted_on(episode):
    """Returns the observations the policy acted on (not waits), and the last one."""
    obs = [o for o, a in zip(episode.observations, episode.actions) if a.name != "wait"]
    return obs + [episode.observations[-1]]


def elements(obs) -> list:
    """Returns the observation's elements without their ids: Chromium's DOM node numbers, which count
    every node the renderer made, in the order responses arrived (web/recording.py: not reproduced)."""
    return [dataclasses.replace(e, id=0) for e in obs.elements]


def pixels(png: bytes) -> bytes:
    return Image.open(io.BytesIO(png)).convert("RGB").tobytes()


def test_record_then_replay_offline(loop, tmp_path):
    tapes = tmp_path / "tapes"
    with RecordedSite() as site:
        task = site.task()
        recorded = run(loop, Tape(RECORD, str(tapes)), task, site_policy())
        port, hits = site.port, list(site.hits)
    assert recorded.complete and recorded.success, (recorded.reason, recorded.faults)
    assert ("POST", "/submit") in hits and ("GET", "/go") in hits and recorded.off_record is None
    recording = Recording.from_dict(recorded.recording)
    check_recording(tapes, recording)
    state = json.loads((tapes / recording.state).read_text())
    assert [c["name"] for c in state["storage_end"]["cookies"]] == ["visitor"]
    assert state["storage_end"]["origins"][0]["localStorage"] == [{"name": "visits", "value": "3"}]

    # The site is down: everything comes from the HAR, the page clock reads the recorded instant.
    replayed = run(loop, Tape(REPLAY, str(tapes)), task, site_policy())
    assert replayed.complete and replayed.off_record is None, (replayed.faults, replayed.off_record)
    assert (replayed.reward, replayed.success) == (recorded.reward, recorded.success) == (1.0, True)
    a, b = acted_on(recorded), acted_on(replayed)
    assert [o.url for o in a] == [o.url for o in b] and len(a) == 4
    for i, (x, y) in enumerate(zip(a, b)):
        assert elements(x) == elements(y), f"observation {i}: {set(elements(x)) ^ set(elements(y))}"
    assert any("cookie [visitor=alice]" in e.name for e in a[1].elements)  # the recorded cookie came back
    assert [pixels(o.screenshot) for o in a] == [pixels(o.screenshot) for o in b]

    # A policy that goes elsewhere: the request is refused and named; the site, back up, never sees it.
    with RecordedSite(port) as site:
        off = run(loop, Tape(REPLAY, str(tapes)), task, site_policy(off_record=True))
        assert site.hits == []
    assert off.complete and off.off_record == f"http://127.0.0.1:{port}/never"


def test_damaged_recording_is_named(loop, tmp_path):
    tapes = tmp_path / "tapes"
    with RecordedSite() as site:
        task = site.task()
        recording = Recording.from_dict(run(loop, Tape(RECORD, str(tapes)), task, site_policy()).recording)
    har = tapes / recording.har
    data = bytearray(har.read_bytes())
    data[len(data) // 2] ^= 0x20
    har.write_bytes(bytes(data))
    with pytest.raises(DamagedRecording, match=f"{har}.* is damaged"):
        check_recording(tapes, recording)
    har.write_bytes(b'{"log": ')
    with pytest.raises(DamagedRecording, match=f"{har} is not a readable HAR"):
        run(loop, Tape(REPLAY, str(tapes)), task, site_policy())


def test_replay_follows_a_suite_that_serves_its_pages_on_a_new_port(loop, tmp_path):
    tapes = tmp_path / "tapes"
    with RecordedSite() as site:
        recorded = run(loop, Tape(RECORD, str(tapes)), site.task(), site_policy(), base_url=f"http://{site.netloc}/")
    with RecordedSite() as other:  # another port; the first site is down
        moved = dataclasses.replace(other.task(), id=recorded.request.task.id)
        netloc = other.netloc
    replayed = run(loop, Tape(REPLAY, str(tapes)), moved, site_policy(), base_url=f"http://{netloc}/")
    assert replayed.complete and replayed.off_record is None and replayed.success, (replayed.faults, replayed.off_record)
    assert [o.url for o in acted_on(replayed)] == [o.url.replace(recorded.request.task.start_url, moved.start_url)
                                                   for o in acted_on(recorded)]
