"""The collection report from store records (no browser): figures for known groups, files, stage config errors."""
import dataclasses
import json
import pathlib
import sys

import ml_collections
import pytest
from PIL import Image

from rmsweb_jax.collect.report import compute_report, write_report
from rmsweb_jax.collect.store import StoreError, StoreWriter, TrajectoryStore
from rmsweb_jax.judges.base import Verdict
from tests.collect.groups import group


def _store(tmp_path):
    faulted = group("faulted", 0, solved_at=2)
    # Attempt 1 of this group was lost to browser faults: no steps, a verdict the collector wrote.
    lost = dataclasses.replace(faulted[0][0], num_steps=0, status="failed", prompt_tokens=0, completion_tokens=0,
                               verdict=Verdict(outcome="error", reason="browser faults: crash", judge="pool"),
                               success=False, reward=None)
    faulted = [(lost, []), (dataclasses.replace(faulted[1][0], reflections=()), faulted[1][1])]
    groups = [group("a", 0, solved_at=1), group("a", 1, solved_at=2), group("b", 0, solved_at=3),
              group("b", 1, solved_at=None), faulted]
    with StoreWriter(tmp_path / "store", flush_every_tasks=2) as store:
        for g in groups:
            store.add_group(g)
    return tmp_path / "store"


def test_figures_for_known_groups(tmp_path):
    report = compute_report(TrajectoryStore(_store(tmp_path)), attempts=3)
    assert report["tasks"] == 5 and report["trajectories"] == 1 + 2 + 3 + 3 + 2
    assert report["solved_at_attempt"] == {"1": 1, "2": 2, "3": 1}
    assert report["success_at_1"] == 0.2 and report["success_at_le_k"] == {"1": 0.2, "2": 0.6, "3": 0.8}
    assert report["yield_gain"] == 0.6 and report["yield_ratio"] == 4.0
    # groups.group(): a solving attempt takes 2 steps, a failed one 3; the faulted first attempt 0.
    assert report["mean_steps_solved_first_attempt"] == 2.0
    assert report["mean_steps_solved_retried"] == 2.0
    assert report["mean_steps_failed_first_attempt_of_retried"] == round((3 + 3 + 0) / 3, 3)
    assert report["judge"] == {"verdicts": 10, "endpoint_calls": 0, "errors": 0,
                               "attempts_lost_to_browser_faults": 1, "names": ["programmatic"]}
    assert report["policy"]["reflections_written"] == 0 + 1 + 2 + 2 + 0
    assert report["policy"]["steps_acted"] == report["steps"] == 2 + 5 + 8 + 9 + 2
    assert report["by_task"]["b"] == {"groups": 2, "solved_at_1": 0, "solved": 1, "attempts": 6}


def test_report_files(tmp_path):
    store_dir = _store(tmp_path)
    report = write_report(store_dir, tmp_path / "out", attempts=3, name="collect_report", extra={"wall_s": 1.5})
    saved = json.loads((tmp_path / "out" / "collect_report.json").read_text())
    assert saved == json.loads(json.dumps(report)) and saved["run"] == {"wall_s": 1.5}
    md = (tmp_path / "out" / "collect_report.md").read_text()
    assert "| success@1 | 20.0% (1/5) |" in md and "| success@≤3 | 80.0% (4/5) |" in md
    img = Image.open(tmp_path / "out" / "collect_report.png")
    assert img.size == (840, 360) and len(set(img.getdata())) > 3
    with pytest.raises(StoreError, match="holds no trajectories to report on"):
        StoreWriter(tmp_path / "empty").close()
        write_report(tmp_path / "empty", tmp_path / "out")


def test_stage_config_errors_are_named(tmp_path):
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "configs"))
    from common import base_config

    from rmsweb_jax.stages import collect as stage
    config = base_config()
    config.collect.tasks = "click-button,no-such-task"
    with pytest.raises(ValueError, match=r"'miniwob.no-such-task' has no page"):
        stage.miniwob_tasks(config.collect)
    config.collect.tasks = "click-button"
    assert [t.id for t in stage.miniwob_tasks(config.collect)] == ["miniwob.click-button"]
    config.collect.policy = "gpt:4"
    with pytest.raises(ValueError, match=r"collect.policy 'gpt:4': expected 'teacher'"):
        stage.make_policy(config, tmp_path, ["miniwob.click-button"])
    config.collect.policy = "http:http://127.0.0.1:9/v1"
    with pytest.raises(ValueError, match=r"expected '<base_url>#<model>'"):
        stage.make_policy(config, tmp_path, ["miniwob.click-button"])
    config.collect.policy = "teacher"
    with pytest.raises(ValueError, match="no solver for tasks"):
        stage.make_policy(config, tmp_path, ["miniwob.book-flight"])
    config.collect.judge = "programmatic:http://x#y"
    with pytest.raises(ValueError, match="takes no endpoint"):
        stage.make_judge(config.collect)
    config.collect.judge = "webvoyager:http://127.0.0.1:9/v1#judge"
    assert stage.make_judge(config.collect).name == "webvoyager"
    config.collect.suite = "mind2web"
    with pytest.raises(ValueError, match=r"collect.suite 'mind2web': expected one of"):
        stage.run(config, tmp_path)
    config.collect.suite = "webvoyager"  # a live suite runs, but not with the MiniWoB++ teacher
    with pytest.raises(ValueError, match=r"'teacher' cannot play the webvoyager suite"):
        stage.run(config, tmp_path)
    assert isinstance(config.collect.teacher, ml_collections.ConfigDict)
