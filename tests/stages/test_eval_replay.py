"""eval with collect.record=har, then eval.replay of that store with the site and the judge endpoint down:
the same episode, reward and verdict (the judge's reply from the store's cache); a changed judge request
asks the judge again; a damaged recording is named before any browser starts."""
import json

import pytest

from rmsweb_jax.collect.store import TrajectoryStore
from rmsweb_jax.errors import UserError
from rmsweb_jax.stages import eval as eval_stage
from tests.collect.test_live_collect import PAGES, ScriptedLLM, _config

pytestmark = pytest.mark.browser


@pytest.fixture()
def shop_tasks(tmp_path):
    from rmsweb_jax.suites.http_server import LocalHTTPServer
    site = tmp_path / "site"
    site.mkdir()
    for name, html in PAGES.items():
        (site / name).write_text(html)
    server = LocalHTTPServer(site)
    path = tmp_path / "shop_tasks.jsonl"
    path.write_text(json.dumps({"web_name": "Widget Shop", "id": "Widget Shop--1", "web": server.url("index.html"),
                                "ques": "Find the price of the Blue Widget in the Widget Shop and answer with it."})
                    + "\n")
    yield path, server
    server.close()


def _eval_config(task_file, agent_url, judge_url, **eval_fields):
    config = _config(task_file, agent_url, judge_url)
    config.eval.policies = f"agent=http:{agent_url}#scripted-agent"
    config.eval.training_store, config.eval.first_seed, config.eval.num_seeds = "none", 0, 1
    config.eval.max_steps, config.eval.viewer, config.eval.bootstrap_samples = 6, False, 100
    for key, value in eval_fields.items():
        setattr(config.eval, key, value)
    return config


def _episode(workdir):
    (store_dir,) = (workdir / "eval").glob("agent@*/store")
    with TrajectoryStore(store_dir) as store:
        (episode,) = store.trajectories()
        return store_dir, episode, [s.screenshot for s in store.steps(episode)]


def test_record_then_replay_with_site_and_judge_down(tmp_path, shop_tasks):
    task_file, shop = shop_tasks
    agent, judge = ScriptedLLM(), ScriptedLLM()
    try:
        config = _eval_config(task_file, agent.base_url, judge.base_url)
        config.collect.record = "har"
        eval_stage.run(config, tmp_path / "live")
        judge.close()
        shop.close()
        store_dir, recorded, shots = _episode(tmp_path / "live")
        assert recorded.recording and recorded.verdict.outcome == "failure" and len(judge.of("judge")) == 1
        (marker,) = store_dir.glob("flush-*.json")
        assert json.loads(marker.read_text())["recordings"] == [{
            "file": f"recordings/{recorded.recording['har']}", "bytes": recorded.recording["bytes"],
            "sha256": recorded.recording["sha256"]}]

        report = eval_stage.run(_eval_config(task_file, agent.base_url, judge.base_url, replay=str(store_dir)),
                                tmp_path / "replay")
        _, replayed, replayed_shots = _episode(tmp_path / "replay")
        assert replayed.off_record is None and report["policies"][0]["overall"]["off_record"] == 0
        assert replayed.verdict == recorded.verdict and (replayed.reward, replayed.success) == (
            recorded.reward, recorded.success)
        assert replayed.final_answer == recorded.final_answer and replayed_shots == shots

        # Another judge request (fewer screenshots shown): not in the cache, so the judge is asked.
        judge = ScriptedLLM(judge_reply="Looks right. SUCCESS")
        config = _eval_config(task_file, agent.base_url, judge.base_url, replay=str(store_dir))
        config.collect.judge_screenshots = 1
        eval_stage.run(config, tmp_path / "rejudged")
        assert len(judge.of("judge")) == 1 and _episode(tmp_path / "rejudged")[1].verdict.outcome == "success"

        har = store_dir / "recordings" / recorded.recording["har"]
        har.write_bytes(har.read_bytes()[:-10])
        with pytest.raises(UserError, match=f"eval.replay: recording {har} is damaged"):
            eval_stage.run(_eval_config(task_file, agent.base_url, judge.base_url, replay=str(store_dir)),
                           tmp_path / "damaged")
    finally:
        agent.close()
        judge.close()
