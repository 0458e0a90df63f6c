"""The sft and action_accuracy stages end to end on a small store: the loss falls, the data-iterator
state is checkpointed with the model, the HF export is evaluated on the held-out task groups that
sft wrote down, even after more groups reach the store between the two stages."""
import json

import numpy as np
import orbax.checkpoint as ocp
import pytest

from rmsweb_jax.agents.prompt import prompt_config_from
from rmsweb_jax.collect.sft_view import SFTView
from rmsweb_jax.data.sft import EncodeSFTExample, SFTBatches, SFTDataConfig, split_by_task
from rmsweb_jax.collect.store_fixture import task_group, write_synthetic_store
from rmsweb_jax.main import run_stages
from rmsweb_jax.processing.image import ImageProcessorConfig
from tests.settings import store_writer


STEPS, ROWS = 6, 2


def _config():
    from configs.common import base_config
    c = base_config()
    c.stages = ("sft", "action_accuracy")
    c.model.init = "random:tiny"
    c.mesh.shape = (1, 1, 1)
    # 200x120 screenshots resize to 224x352 (308 patches, 77 tokens); prompts are ~2.3-2.5k tokens.
    c.data.buckets = (2560,)
    c.data.bucket_patches = (640,)
    c.data.held_out_fraction = 0.25
    c.train.batch_size = ROWS
    c.train.optimizer.lr = 3e-3
    c.train.optimizer.warmup_steps = 1
    c.train.optimizer.total_steps = STEPS
    c.train.checkpoint.every_steps = 3
    c.train.metrics.every_steps = 2
    c.action_accuracy.max_examples = 0  # every held-out step
    c.action_accuracy.batch_size = 2
    c.action_accuracy.max_new_tokens = 12
    return c


@pytest.mark.slow
def test_sft_then_action_accuracy_on_a_small_store(tmp_path):
    store = write_synthetic_store(tmp_path / "store", tasks=4, seeds=2, viewport=(200, 120))
    config = _config()
    config.stages = ("sft",)
    run_stages(config, tmp_path)

    summary = json.loads((tmp_path / "sft" / "summary.json").read_text())
    assert summary["steps"] == STEPS and summary["resumed_from"] is None
    assert summary["last_loss"] < summary["first_loss"] - 0.2, summary  # windows of steps 1-2 vs 5-6
    assert (tmp_path / "sft" / "hf" / "config.json").is_file()
    view = SFTView(store)
    split = split_by_task(view, 0.25, 0)
    saved_split = json.loads((tmp_path / "sft" / "split.json").read_text())
    assert [tuple(k) for k in saved_split["held_out_task_groups"]] == list(split.held_out_keys)
    assert summary["train_examples"] == len(split.train) == 18

    # The checkpoint holds the pipeline's position: exactly where a fresh pipeline is after STEPS batches.
    manager = ocp.CheckpointManager(tmp_path / "sft" / "checkpoints")
    assert manager.latest_step() == STEPS
    saved = manager.restore(STEPS, args=ocp.args.Composite(data=ocp.args.JsonRestore())).data
    manager.close()
    data = SFTDataConfig.from_config(config.data, tmp_path)
    encoder = EncodeSFTExample(summary["init_dir"], ImageProcessorConfig(), prompt_config_from(config), mask=data.mask)
    with SFTBatches(view, split.train, data, encoder, rows=ROWS) as batches:
        for _ in range(STEPS):
            next(batches)
        assert saved == {"kind": "json", "value": batches.get_state()}
    assert saved["value"]["parent"]["next_index"] == STEPS * ROWS

    # Collection goes on between the stages: four more task groups reach the store.
    with store_writer(store) as writer:
        for t in range(4):
            writer.add_group(task_group(f"synthetic.late-{t}", 0, fail_first=False, viewport=(200, 120), variant=t))
    config.stages = ("action_accuracy",)
    run_stages(config, tmp_path)
    train_keys = {tuple(k) for k in saved_split["train_task_groups"]}
    assert len(train_keys) == 6 and set(split_by_task(SFTView(store), 0.25, 0).held_out_keys) & train_keys

    report = json.loads((tmp_path / "sft_eval.json").read_text())
    evaluated = {(r["task_id"], r["seed"]) for r in report["examples"]}
    assert evaluated == set(split.held_out_keys) and not evaluated & train_keys  # no training group held out
    assert report["split"] == str(tmp_path / "sft" / "split.json")
    assert report["steps"] == len(split.held_out) == 6 and report["checkpoint"] == f"hf:{tmp_path / 'sft' / 'hf'}"
    assert report["reference_agreement"] == 1.0  # the scoring agrees with every stored action
    assert report["held_out_task_groups"] == 2
    held = {f"{view[int(i)].request_id}/{view[int(i)].step.step}" for i in split.held_out}
    assert {r["example"] for r in report["examples"]} <= held
    assert all(isinstance(r["correct"], bool) and r["finish_reason"] in ("stop", "length") for r in report["examples"])
    assert 0.0 <= report["accuracy"] <= 1.0 and report["correct"] == sum(r["correct"] for r in report["examples"])
    assert np.isclose(report["accuracy"], report["correct"] / 6)
