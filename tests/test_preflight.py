"""Every selected stage's settings are built before the first stage runs (stages/pipeline.py check_stages): a bad
value of a late stage fails in seconds, in one line naming the stage, the key and the value, with nothing written;
the shipped configs pass the check of the stages they serve."""
import importlib
import os
import subprocess
import sys

import pytest

from configs.common import base_config
from rmsweb_jax.errors import UserError
from rmsweb_jax.stages.pipeline import STAGES, check_stages, stage_module

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHIPPED = ("demo", "qwen3_vl_8b", "qwen3_vl_8b_sft", "qwen3_vl_8b_salvage", "qwen3_vl_32b", "qwen3_vl_32b_sft",
           "qwen3_vl_32b_salvage")


@pytest.mark.parametrize("override, stage, wants", [
    ("--config.salvage.loss.clip_low=1.5", "salvage", "config.salvage.loss.clip_low = 1.5: expected < 1"),
    ("--config.mine.routine_share=1.5", "mine", "config.mine.routine_share must be in [0, 1)"),
], ids=["salvage", "mine"])
def test_a_late_stage_mistake_fails_before_the_first_stage_runs(tmp_path, override, stage, wants):
    workdir = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "rmsweb_jax.main", "--config=configs/demo.py",
                           f"--workdir={workdir}", override], cwd=REPO, capture_output=True, text=True, timeout=120)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert proc.returncode == 2 and len(lines) == 1, (proc.returncode, proc.stderr[-3000:])
    assert lines[0].startswith(f"rmsweb: error: stage {stage}'s settings refused the config") and wants in lines[0]
    assert "running" not in proc.stdout, proc.stdout  # no stage started (the demo's first is model, then collect)
    assert not workdir.exists()  # not even the lock, config.json or stages.json


def _config(stages, key, value):
    config = base_config()
    config.stages = stages
    *path, last = key.split(".")
    node = config
    for part in path:
        node = node[part]
    node[last] = value
    return config


# One field per settings builder that a stage's check_config calls, set out of range.
BAD = [
    ("collect", "collect.attempts", 0, "config.collect.attempts must be >= 1"),          # CollectSettings
    ("collect", "collect.judge", "bogus", "unknown judge 'bogus'"),                      # judge_spec
    ("collect", "collect.retry_mode", "sometimes", "collect.retry_mode 'sometimes'"),
    ("collect", "collect.success", "mostly", "collect.success"),                         # check_success_rule
    ("sft", "train.microbatches", 0, "config.train.microbatches = 0"),                   # TrainSettings
    ("sft", "train.optimizer.lr", -1.0, "config.train.optimizer.lr"),                    # OptimizerConfig
    ("sft", "data.worker_count", -1, "config.data.worker_count = -1"),                   # SFTDataConfig
    ("sft", "prompt.observation", "bogus", "config.prompt"),                             # PromptConfig
    ("train_smoke", "train.batch_size", 0, "config.train.batch_size = 0"),
    ("action_accuracy", "action_accuracy.mode", "bogus", "config.action_accuracy.mode = 'bogus'"),
    ("mine", "mine.tau", 1.5, "config.mine.tau must be in (0, 1]"),                      # ReplaySettings
    ("mine", "mine.max_states", -1, "config.mine.max_states must be >= 0"),
    ("salvage", "salvage.loss.clip_low", 1.5, "config.salvage.loss.clip_low = 1.5"),     # RLLossSettings
    ("salvage", "salvage.gates", "bogus", "config.salvage.gates"),                       # GateSettings
    ("salvage", "salvage.train.lr", -1.0, "config.salvage.train.lr = -1.0"),             # train_config
    ("salvage", "salvage.group_size", 10_000, "cannot hold"),                            # the batch holds B x G
    ("salvage", "salvage.epochs", 0, "config.salvage.epochs = 0: expected an int >= 1"),  # LearnerSettings
    ("salvage", "salvage.epochs", 7, "is not a multiple of config.salvage.epochs = 7"),  # the run ends at a draw
    ("eval", "eval.num_seeds", 0, "eval.num_seeds must be an int >= 1"),
    ("eval", "collect.step_timeout_s", 0.0, "config.collect.step_timeout_s = 0.0"),      # CollectSettings as eval plays
    ("transfer", "transfer.batch_size", 0, "config.transfer.batch_size must be an int >= 1"),
    ("transfer", "mine.samples", 0, "config.mine.samples must be >= 1"),                 # ReplaySettings as it replays
]


@pytest.mark.parametrize("stage, key, value, wants", BAD, ids=[f"{s}:{k}" for s, k, _, _ in BAD])
def test_each_settings_builder_refuses_an_out_of_range_value_in_one_line(tmp_path, stage, key, value, wants):
    with pytest.raises(UserError) as refused:
        check_stages(_config((stage,), key, value), tmp_path / "run")
    message = str(refused.value)
    assert message.startswith(f"stage {stage}'s settings refused the config") and wants in message, message
    assert "\n" not in message
    assert not (tmp_path / "run").exists()


def test_every_stage_declares_its_check():
    assert [name for name in STAGES if not callable(getattr(stage_module(name), "check_config", None))] == []


@pytest.mark.parametrize("name", SHIPPED)
def test_the_shipped_configs_pass_the_check_of_the_stages_they_serve(tmp_path, name):
    # Every stage but salvage for the base and sft presets: their train.batch_size is sft's, smaller than salvage's
    # B x G rows (the *_salvage presets set it)
    config = importlib.import_module(f"configs.{name}").get_config()
    config.stages = tuple(s for s in STAGES if s != "salvage" or name == "demo" or name.endswith("_salvage"))
    check_stages(config, tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_the_disk_warning_counts_each_training_stage_s_checkpoints_and_export():
    """keep + 1 checkpoints at once (parameters and AdamW's two moments, fp32 each) and one export of the parameters,
    per training stage; nothing for stages that train nothing."""
    from rmsweb_jax.plan import disk
    from rmsweb_jax.plan.planner import architecture
    from rmsweb_jax.models.qwen3_vl.layers import num_params
    from rmsweb_jax.models.qwen3_vl import abstract_model
    from rmsweb_jax.models.from_config import runtime_from_config
    c = importlib.import_module("configs.qwen3_vl_8b_sft").get_config("v5p")
    params = num_params(abstract_model(architecture(c)[0], runtime_from_config(c.model)))
    keep = c.train.checkpoint.keep
    writes = disk.planned_writes(c, ("collect", "sft", "eval"))
    want = (keep + 1) * 12 * params + 4 * params
    assert list(writes) == ["sft"] and 0 <= writes["sft"] - want < 1024, (writes, want)  # + the optimizer's counters
    assert disk.planned_writes(c, ("collect", "eval")) == {}
    warning = disk.space_warning(c, "/", ("sft",))
    free = disk.free_bytes("/")
    assert (warning is None) == (free >= writes["sft"])


def test_a_full_disk_is_found_under_the_errors_that_wrap_it():
    import errno
    from rmsweb_jax.errors import disk_full
    full = OSError(errno.ENOSPC, "No space left on device", "/w/ckpt/4")
    try:
        try:
            raise full
        except OSError as err:
            raise RuntimeError("Failed to run 5 Handler Commit operations") from err
    except RuntimeError as wrapped:
        assert disk_full(wrapped) is full
    assert disk_full(ValueError("Error writing local file: No space left on device [OS error: 28]")).startswith("Error")
    assert disk_full(OSError(errno.EACCES, "Permission denied")) is None and disk_full(RuntimeError("x")) is None
    # a bucket's quota, as tensorstore quotes it; another service's quota (a judge's API) is not a full disk
    bucket = ValueError("PERMISSION_DENIED: Error writing gs://b/run/sft/checkpoints/4/d: Quota exceeded for quota "
                        "metric 'storage bytes'")
    assert disk_full(bucket).startswith("PERMISSION_DENIED: Error writing gs://b/run/sft/checkpoints/4/d")
    assert disk_full(RuntimeError("judge http://judge:8000/v1: 429 Quota exceeded for this API key")) is None
