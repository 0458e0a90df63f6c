"""The demo regime: the `random:demo` preset trained on element-list prompts learns (the loss falls on a
fixed store), and — closed loop in real Chromium — a policy overfit on a handful of scripted click-test
episodes plays its own actions back through the eval stage, which measures it on held-out seeds only."""
import json

import pytest

from rmsweb_jax.collect.store_fixture import write_synthetic_store
from rmsweb_jax.errors import UserError
from rmsweb_jax.main import run_stages
from rmsweb_jax.stages import eval as eval_stage


def _demo_config(steps: int, rows: int):
    from configs.demo import get_config
    c = get_config()
    c.mesh.shape = (1, 1, 1)
    c.collect.progress = False
    c.sft.init = "model"  # these tests train SFT alone, from the preset
    c.train.batch_size = rows
    c.train.optimizer.warmup_steps = 2
    c.train.optimizer.total_steps = steps
    c.train.checkpoint.every_steps = steps
    c.train.checkpoint.async_save = False
    c.train.metrics.every_steps = 2
    return c


def test_the_closed_loop_mode_of_action_accuracy_points_to_the_eval_stage(tmp_path):
    config = _demo_config(steps=1, rows=1)
    config.stages, config.action_accuracy.mode = ("action_accuracy",), "closed_loop"
    with pytest.raises(UserError, match="now the eval stage: run --config.stages=eval"):
        run_stages(config, tmp_path)


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
    config.stages = ("collect", "sft", "eval")
    config.collect.tasks = "click-test"
    config.collect.num_seeds = 4
    # One browser: the store's order, and with it the order SFT's seeded shuffle gives its rows, is then the same
    # every run. With two the episodes could land in any order, and one make test run's policy replayed 2 of 4.
    config.collect.workers = 1
    config.collect.attempts = 1
    config.collect.teacher.wrong_element_p = config.collect.teacher.detour_p = 0.0
    config.collect.teacher.early_stop_p = 0.0
    config.train.optimizer.lr = 5e-3
    config.eval.policies = "sft"
    config.eval.first_seed = 1000
    config.eval.num_seeds = 2
    config.eval.max_steps = 3
    config.eval.viewer = False
    run_stages(config, tmp_path)
    report = json.loads((tmp_path / "eval" / "eval_report.json").read_text())
    (policy,) = report["policies"]
    assert policy["overall"]["episodes"] == 2 and set(policy["tasks"]) == {"miniwob.click-test"}, policy

    # Its own training seeds, played afresh (the seed check off, as a user must say explicitly).
    config.eval.first_seed, config.eval.num_seeds, config.eval.training_store = 0, 4, "none"
    replay = eval_stage.run(config, tmp_path)
    assert replay["policies"][0]["tasks"]["miniwob.click-test"]["solved"] >= 3, replay["policies"][0]

    config.eval.first_seed, config.eval.training_store = 3, ""  # seed 3 was collected and trained on
    with pytest.raises(UserError, match="overlap the training store"):
        eval_stage.run(config, tmp_path)
