"""The collection report from store records (no browser): figures for known groups (raw rewards,
browser-fault reruns apart from attempts), the success rule it names and checks, files, stage
config errors."""
import dataclasses
import json

import ml_collections
import pytest
from PIL import Image

from rmsweb_jax.collect.report import compute_report, write_report
from rmsweb_jax.collect.store import StoreError, TrajectoryStore
from rmsweb_jax.judges.base import Verdict
from rmsweb_jax.collect.store_fixture import retry_group as group
from tests.settings import store_writer


def _partial(task_id, seed, reward, *, success):
    """A group whose attempt 1 got partial credit `reward` (judged `success`), solved on attempt 2
    unless attempt 1 already counted."""
    g = group(task_id, seed, solved_at=1 if success else 2)
    first, steps = g[0]
    verdict = Verdict(outcome="success" if success else "failure", reason="partial", score=reward, judge="programmatic")
    return [(dataclasses.replace(first, reward=reward, verdict=verdict, success=success, suite_success=False),
             steps), *g[1:]]


def _store(tmp_path, extra=()):
    # Solved on attempt 1 after one rerun for a browser fault: the rerun took no attempt number.
    rerun = group("rerun", 0, solved_at=1)
    rerun = [(dataclasses.replace(rerun[0][0], faults=("worker 0: browser crashed at step 1",)), rerun[0][1])]
    # Lost to browser faults (all runs): no steps, the collector's verdict; the group ended there.
    lost = group("lost", 0, solved_at=1)[0][0]
    lost = dataclasses.replace(lost, num_steps=0, status="failed", prompt_tokens=0, completion_tokens=0,
                               verdict=Verdict(outcome="error", reason="browser faults: crash", judge="pool"),
                               success=False, reward=None, suite_success=None, faults=("crash 1", "crash 2"))
    groups = [group("a", 0, solved_at=1), group("a", 1, solved_at=2), group("b", 0, solved_at=3),
              group("b", 1, solved_at=None), rerun, [(lost, [])], _partial("p", 0, 0.6, success=False), *extra]
    with store_writer(tmp_path / "store", flush_every_tasks=2) as store:
        for g in groups:
            store.add_group(g)
    return tmp_path / "store"


def test_figures_for_known_groups(tmp_path):
    report = compute_report(TrajectoryStore(_store(tmp_path)), attempts=3, success_rule="solved")
    assert report["success_rule"] == "solved" and report["success_rule_meaning"] == "raw reward >= 1 - 1e-06"
    assert report["tasks"] == 7 and report["trajectories"] == 1 + 2 + 3 + 3 + 1 + 1 + 2
    # The rerun group counts as solved on attempt 1, not as a retry; the partial reward is no success.
    assert report["solved_at_attempt"] == {"1": 2, "2": 2, "3": 1}
    assert report["success_at_1"] == round(2 / 7, 4)
    assert report["success_at_le_k"] == {"1": round(2 / 7, 4), "2": round(4 / 7, 4), "3": round(5 / 7, 4)}
    assert report["yield_gain"] == round(5 / 7 - 2 / 7, 4) and report["yield_ratio"] == round(0.7143 / 0.2857, 4)
    # group(): a solving attempt takes 2 steps, a failed one 3.
    assert report["mean_steps_solved_first_attempt"] == 2.0
    assert report["mean_steps_solved_retried"] == 2.0
    assert report["mean_steps_failed_first_attempt_of_retried"] == 3.0
    assert report["browser_faults"] == {"faults": 3, "attempts_rerun": 1, "attempts_lost": 1}
    assert report["judge"] == {"verdicts": 12, "endpoint_calls": 0, "errors": 0, "names": ["programmatic"]}
    # Raw rewards: -1 per failed attempt, 1 per solved one, 0.6 for the partial one; none for the lost attempt.
    rewards = [1] + [-1, 1] + [-1, -1, 1] + [-1, -1, -1] + [1] + [0.6, 1]
    first = [1, -1, -1, -1, 1, 0.6]
    assert report["raw_reward"] == {"mean": round(sum(rewards) / 12, 3), "mean_first_attempt": round(sum(first) / 6, 3),
                                    "attempts_with_reward": 12, "partial": 1}
    assert report["policy"]["reflections_written"] == 0 + 1 + 2 + 2 + 0 + 0 + 1
    assert report["policy"]["steps_acted"] == report["steps"] == 2 + 5 + 8 + 9 + 2 + 0 + 5
    assert report["by_task"]["b"] == {"groups": 2, "solved_at_1": 0, "solved": 1, "attempts": 6,
                                      "mean_raw_reward": round(-4 / 6, 3), "partial_rewards": 0}
    assert report["by_task"]["p"] == {"groups": 1, "solved_at_1": 0, "solved": 1, "attempts": 2,
                                      "mean_raw_reward": 0.8, "partial_rewards": 1}


def test_the_report_checks_the_success_rule_against_the_store(tmp_path):
    # A partial reward judged a success: what collect.success = "positive_reward" stores.
    store_dir = _store(tmp_path, extra=[_partial("q", 0, 0.2, success=True)])
    with pytest.raises(StoreError, match=r"q#0@1 .*raw reward 0\.2 was judged a success, which the success rule "
                                         r"'solved' \(raw reward >= 1 - 1e-06\) does not give; the store was "
                                         r"collected under collect.success='positive_reward'"):
        compute_report(TrajectoryStore(store_dir), success_rule="solved")
    # ... and p#0@1 (0.6 judged a failure) is what "positive_reward" would not give.
    with pytest.raises(StoreError, match=r"p#0@1 .*raw reward 0\.6 was judged a failure"):
        compute_report(TrajectoryStore(store_dir), success_rule="positive_reward")
    with pytest.raises(ValueError, match=r"success_rule 'any': expected one of \['positive_reward', 'solved'\]"):
        compute_report(TrajectoryStore(store_dir), success_rule="any")


def test_report_files(tmp_path):
    store_dir = _store(tmp_path)
    report = write_report(store_dir, tmp_path / "out", attempts=3, success_rule="solved", name="collect_report",
                          extra={"wall_s": 1.5})
    saved = json.loads((tmp_path / "out" / "collect_report.json").read_text())
    assert saved == json.loads(json.dumps(report)) and saved["run"] == {"wall_s": 1.5}
    md = (tmp_path / "out" / "collect_report.md").read_text()
    assert "| success rule | solved (raw reward >= 1 - 1e-06) |" in md
    assert "| success@1 | 28.6% (2/7) |" in md and "| success@≤3 | 71.4% (5/7) |" in md
    assert "| attempts with a partial raw reward (0 < r < 1) | 1 of 12 |" in md
    assert "| browser faults / attempts rerun after them (not retries) / attempts lost to them | 3 / 1 / 1 |" in md
    assert "| p | 1 | 0 | 1 | 2 | 0.8 | 1 |" in md  # the per-task raw reward column
    img = Image.open(tmp_path / "out" / "collect_report.png")
    assert img.size == (840, 360) and len(set(img.getdata())) > 3
    with pytest.raises(StoreError, match="holds no trajectories to report on"):
        store_writer(tmp_path / "empty").close()
        write_report(tmp_path / "empty", tmp_path / "out", success_rule="solved")


def test_stage_config_errors_are_named(tmp_path):
    from configs.common import base_config

    from rmsweb_jax.judges.from_config import judge_from_config
    from rmsweb_jax.stages import collect as stage
    from rmsweb_jax.suites.from_config import miniwob_tasks
    config = base_config()
    config.collect.tasks = "click-button,no-such-task"
    with pytest.raises(ValueError, match=r"'miniwob.no-such-task' has no page"):
        miniwob_tasks(config.collect)
    config.collect.tasks = "click-button"
    assert [t.id for t in miniwob_tasks(config.collect)] == ["miniwob.click-button"]
    config.collect.policy = "gpt:4"
    with pytest.raises(ValueError, match=r"collect.policy 'gpt:4': expected 'teacher'"):
        stage.make_policy(config, tmp_path, ["miniwob.click-button"])
    config.collect.policy = "http:http://127.0.0.1:9/v1"
    with pytest.raises(ValueError, match=r"expected '<base_url>#<model>'"):
        stage.make_policy(config, tmp_path, ["miniwob.click-button"])
    config.collect.policy = "teacher"
    with pytest.raises(ValueError, match="no solver for tasks"):
        stage.make_policy(config, tmp_path, ["miniwob.book-flight"])
    config.collect.success = "mostly"
    with pytest.raises(ValueError, match=r"collect.success 'mostly': expected one of \['positive_reward', 'solved'\]"):
        judge_from_config(config.collect)
    config.collect.success = "positive_reward"
    assert judge_from_config(config.collect).success == "positive_reward"
    config.collect.judge = "programmatic:http://x#y"
    with pytest.raises(ValueError, match="takes no endpoint"):
        judge_from_config(config.collect)
    config.collect.judge = "webvoyager:http://127.0.0.1:9/v1#judge"
    assert judge_from_config(config.collect).name == "webvoyager"
    config.collect.suite = "mind2web"
    with pytest.raises(ValueError, match=r"collect.suite 'mind2web': expected one of"):
        stage.run(config, tmp_path)
    config.collect.suite = "webvoyager"  # a live suite runs, but not with the MiniWoB++ teacher
    with pytest.raises(ValueError, match=r"'teacher' cannot play the webvoyager suite"):
        stage.run(config, tmp_path)
    assert isinstance(config.collect.teacher, ml_collections.ConfigDict)
