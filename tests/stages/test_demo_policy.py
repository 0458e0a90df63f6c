"""The demo regime: the `random:demo` preset trained on element-list prompts learns (the loss falls on a
fixed store), and — closed loop in real Chromium — a policy overfit on a handful of scripted click-test
episodes plays its own actions back; the closed-loop mode's interval and held-out seed checks."""
import json
import os
import sys

import pytest

from rmsweb_jax.collect.store_fixture import write_synthetic_store
from rmsweb_jax.errors import UserError
from rmsweb_jax.main import run_stages
from rmsweb_jax.stages import closed_loop
from rmsweb_jax.stages.closed_loop import check_disjoint, wilson_interval
from rmsweb_jax.stages.collect import miniwob_tasks

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "configs"))


def _demo_config(steps: int, rows: int):
    from demo import get_config
    c = get_config()
    c.mesh.shape = (1, 1, 1)
    c.collect.progress = False
    c.train.batch_size = rows
    c.train.optimizer.warmup_steps = 2
    c.train.optimizer.total_steps = steps
    c.train.checkpoint.every_steps = steps
    c.train.checkpoint.async_save = False
    c.train.metrics.every_steps = 2
    return c


def test_wilson_interval_matches_the_closed_form_values():
    # Reference values: Wilson (1927) score interval at z = 1.96 (e.g. statsmodels proportion_confint method="wilson").
    assert wilson_interval(5, 10) == pytest.approx((0.2366, 0.7634), abs=1e-4)
    assert wilson_interval(0, 10) == pytest.approx((0.0, 0.2775), abs=1e-4)
    assert wilson_interval(20, 20) == pytest.approx((0.8389, 1.0), abs=1e-4)
    assert wilson_interval(0, 0) == (0.0, 1.0)


def test_held_out_seeds_must_be_disjoint_from_the_trained_ones():
    trained = {("miniwob.focus-text", s) for s in range(10)}
    check_disjoint(["miniwob.focus-text"], [10, 11], trained)
    with pytest.raises(UserError, match=r"overlap the seeds sft trained on: \[\('miniwob.focus-text', 9\)\]"):
        check_disjoint(["miniwob.focus-text"], [9, 10], trained)


@pytest.mark.slow
def test_the_demo_preset_learns_on_a_fixed_store(tmp_path):
    write_synthetic_store(tmp_path / "store", tasks=4, seeds=2, viewport=(500, 240), fail_every=0)
    config = _demo_config(steps=12, rows=4)
    config.stages = ("sft",)
    config.train.optimizer.lr = 3e-3
    run_stages(config, tmp_path)
    summary = json.loads((tmp_path / "sft" / "summary.json").read_text())
    assert summary["steps"] == 12 and summary["last_loss"] < summary["first_loss"] - 1.0, summary
    exported = tmp_path / "sft" / "hf"
    assert (exported / "tokenizer.json").is_file() and (exported / "config.json").is_file()


@pytest.mark.slow
def test_an_overfit_demo_policy_replays_its_actions_closed_loop_and_is_measured_on_held_out_seeds(tmp_path):
    # MiniWoB++ places the button anew on every seed, so 4 memorised episodes cannot click a held-out
    # seed's button (measured: 0/2); what overfitting must give is its own actions back, played in
    # Chromium; the held-out seeds are then measured (and refused when they overlap the trained ones).
    config = _demo_config(steps=150, rows=4)
    config.stages = ("collect", "sft", "action_accuracy")
    config.collect.tasks = "click-test"
    config.collect.num_seeds = 4
    config.collect.attempts = 1
    config.collect.teacher.wrong_element_p = config.collect.teacher.detour_p = 0.0
    config.collect.teacher.early_stop_p = 0.0
    config.train.optimizer.lr = 5e-3
    config.action_accuracy.closed_loop.first_seed = 1000
    config.action_accuracy.closed_loop.num_seeds = 2
    config.action_accuracy.closed_loop.max_steps = 3
    run_stages(config, tmp_path)
    report = json.loads((tmp_path / "closed_loop.json").read_text())
    assert report["seeds"] == [1000, 1001] and report["episodes"] == 2
    assert (tmp_path / "closed_loop.md").read_text().count("| miniwob.click-test |") == 1

    replay = closed_loop.play(config, tmp_path, miniwob_tasks(config.collect), [0, 1, 2, 3])
    assert replay["tasks"]["miniwob.click-test"]["solved"] >= 3, replay  # its own episodes, played afresh

    config.action_accuracy.closed_loop.first_seed = 3  # seed 3 was collected and trained on
    with pytest.raises(UserError, match="overlap the seeds sft trained on"):
        closed_loop.run(config, tmp_path)
