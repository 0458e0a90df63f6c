"""The ground stage on a small store, then sft starting from its export: grounding trains on the training split's
pages only, its loss falls, sft loads the grounded weights (not config.model.init's), and a rerun skips both."""
import json

import numpy as np
import pytest
from safetensors.numpy import load_file

from rmsweb_jax.collect.sft_view import SFTView
from rmsweb_jax.collect.store_fixture import write_synthetic_store
from rmsweb_jax.data.sft import split_by_task
from rmsweb_jax.errors import UserError
from rmsweb_jax.stages.pipeline import run_pipeline as run_stages

STEPS, ROWS = 6, 4


def _config():
    from configs.common import base_config
    c = base_config()
    c.stages = ("ground", "sft")
    c.model.init = "random:tiny"
    c.mesh.shape = (1, 1, 1)
    c.prompt.observation = "elements"  # the demo's prompt: text only, short rows
    c.prompt.system = "compact"
    c.prompt.history_images = 0
    c.data.buckets = (1024,)
    c.data.bucket_patches = (0,)
    c.data.held_out_fraction = 0.25
    c.train.batch_size = 2
    c.train.optimizer.lr = 1e-12  # sft's steps leave the weights where they started (to float noise)
    c.train.optimizer.warmup_steps = 1
    c.train.optimizer.total_steps = 2
    c.train.checkpoint.every_steps = 50
    c.train.metrics.every_steps = 2
    c.ground.train.batch_size = ROWS
    c.ground.train.total_steps = STEPS
    c.ground.train.lr = 3e-3
    c.sft.init = "ground"
    return c


def _weights(folder):
    return {k: v for f in sorted(folder.glob("*.safetensors")) for k, v in load_file(f).items()}


@pytest.mark.slow
def test_ground_then_sft_from_its_checkpoint(tmp_path):
    store = write_synthetic_store(tmp_path / "store", tasks=4, seeds=2, viewport=(200, 120))
    config = _config()
    config.data.store_dir = str(store)  # no collect stage here: the store is the user's
    config.stages = ("ground",)
    run_stages(config, tmp_path)

    summary = json.loads((tmp_path / "ground" / "summary.json").read_text())
    assert summary["steps"] == STEPS and summary["resumed_from"] is None
    assert summary["last_loss"] < summary["first_loss"], summary
    split = split_by_task(SFTView(store), 0.25, 0)
    assert {tuple(k) for k in summary["held_out_task_groups"]} == set(split.held_out_keys)
    trained = {tuple(k) for k in summary["train_task_groups"]}
    assert trained and not trained & set(split.held_out_keys)
    assert trained == {SFTView(store).task_key(i) for i in split.train}
    ground_hf = tmp_path / "ground" / "hf"
    assert (ground_hf / "config.json").is_file()
    # The probe: greedy grounding on rows of the held-out groups' pages only (a random:tiny model gets ~none right).
    probe = summary["held_out_probe"]
    held_out_tasks = {task for task, _ in split.held_out_keys}
    assert probe["rows"] > 0 and 0 <= probe["correct"] <= probe["rows"] and set(probe["by_task"]) <= held_out_tasks
    assert sum(n for _, n in probe["by_task"].values()) == probe["rows"]

    # sft starts from the grounded export: its step-0 weights are ground's last ones, not a fresh random:tiny.
    config.stages = ("ground", "sft")
    records = run_stages(config, tmp_path)
    assert [(r["stage"], r["ran"]) for r in records] == [("ground", False), ("sft", True)]
    sft = json.loads((tmp_path / "sft" / "summary.json").read_text())
    assert sft["init_dir"] == str(ground_hf)
    grounded, tuned = _weights(ground_hf), _weights(tmp_path / "sft" / "hf")
    random_init = _weights(tmp_path / "checkpoints" / "random_tiny")
    assert grounded.keys() == tuned.keys()
    moved = [k for k in grounded if not np.allclose(grounded[k], random_init[k])]
    assert moved  # grounding changed the weights ...
    for k in grounded:  # ... and sft started from them
        np.testing.assert_allclose(tuned[k], grounded[k], atol=1e-6, err_msg=k)

    # A rerun skips both; a change to the grounding reruns ground, and sft after it.
    records = run_stages(config, tmp_path)
    assert [r["ran"] for r in records] == [False, False]
    config.ground.kinds = "click"
    records = run_stages(config, tmp_path)
    assert [r["ran"] for r in records] == [True, True]
    one = json.loads((tmp_path / "ground" / "summary.json").read_text())
    assert one["targets_per_row"] == 1 and one["examples"] == one["rows"]

    # Several targets a row: the same rows in fewer, longer examples.
    config.ground.targets_per_row = 3
    config.stages = ("ground",)
    assert [r["ran"] for r in run_stages(config, tmp_path)] == [True]
    three = json.loads((tmp_path / "ground" / "summary.json").read_text())
    assert three["rows"] == one["rows"] and three["targets_per_row"] == 3
    assert one["rows"] / 3 <= three["examples"] < one["rows"]
    assert three["last_loss"] < three["first_loss"], three

    # Grounding examples mixed into SFT: half an example per training step.
    config.sft.grounding_mix = 0.5
    config.stages = ("sft",)
    assert [r["ran"] for r in run_stages(config, tmp_path)] == [True]
    sft = json.loads((tmp_path / "sft" / "summary.json").read_text())
    assert sft["grounding_examples_mixed"] == round(0.5 * sft["train_examples"]) > 0


def test_no_probe_without_held_out_groups_says_why(tmp_path):
    from rmsweb_jax.stages import ground
    config = _config()
    config.data.held_out_fraction = 0.0
    split = split_by_task(SFTView(write_synthetic_store(tmp_path / "store", tasks=2, seeds=2, viewport=(200, 120))),
                          0.0, 0)
    assert ground.held_out_probe(config, tmp_path, None, split, None, ("click",), tmp_path) == {
        "skipped": "no held-out task groups (config.data.held_out_fraction = 0)"}
    config.ground.probe_rows = 0
    assert ground.held_out_probe(config, tmp_path, None, split, None, ("click",), tmp_path) == {
        "skipped": "config.ground.probe_rows = 0"}


def test_a_bad_targets_per_row_is_refused_before_any_stage_runs(tmp_path):
    from rmsweb_jax.stages import ground
    config = _config()
    config.ground.targets_per_row = 0
    with pytest.raises(UserError, match=r"config.ground.targets_per_row = 0: expected an int >= 1"):
        ground.check_config(config, tmp_path)


def test_sft_init_names_a_starting_point(tmp_path):
    from rmsweb_jax.stages import sft
    config = _config()
    assert sft.init_spec(config, tmp_path) == f"hf:{tmp_path / 'ground' / 'hf'}"
    config.sft.init = "model"
    assert sft.init_spec(config, tmp_path) == "random:tiny"
    config.sft.init = "grounded"
    with pytest.raises(UserError, match="config.sft.init = 'grounded'"):
        sft.check_config(config, tmp_path)


def test_sft_from_ground_without_its_export_says_so(tmp_path):
    write_synthetic_store(tmp_path / "store", tasks=2, seeds=2, viewport=(200, 120))
    config = _config()
    config.stages = ("sft",)
    with pytest.raises(UserError, match="config.sft.init = 'ground': no HF checkpoint"):
        run_stages(config, tmp_path)
