"""The absl entry point: config file + overrides, stages in order, clear errors for unknown stages."""
import json
import os
import subprocess
import sys

import pytest

from rmsweb_jax import main as entry

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
def test_demo_config_runs_the_model_stage_with_overrides(tmp_path):
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=1")
    proc = subprocess.run(
        [sys.executable, "-m", "rmsweb_jax.main", "--config=configs/demo.py", f"--workdir={tmp_path}",
         "--config.stages=model", "--config.smoke.max_new_tokens=5", "--config.smoke.instruction=Type hello"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((tmp_path / "model_smoke.json").read_text())
    assert report["generated_tokens"] <= 5 and report["prompt_tokens"] > 20
    assert report["image_grid_thw"][0][0] == 1
    assert (tmp_path / "checkpoints" / "random_tiny" / "tokenizer.json").is_file()
    stages = json.loads((tmp_path / "stages.json").read_text())
    assert [s["stage"] for s in stages] == ["model"]
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["smoke"]["instruction"] == "Type hello"
    assert "[model] generation" in proc.stdout


def test_unknown_stage_is_named(tmp_path):
    import ml_collections
    config = ml_collections.ConfigDict({"stages": ("model", "sft_typo")})
    with pytest.raises(ValueError, match=r"unknown stage\(s\) \['sft_typo'\]; known stages: \[.*'model'.*\]"):
        entry.run_stages(config, tmp_path)
    # a comma-separated override string names several stages, each checked
    config = ml_collections.ConfigDict({"stages": "model, sft_typo,collect_typo"})
    with pytest.raises(ValueError, match=r"unknown stage\(s\) \['sft_typo', 'collect_typo'\]"):
        entry.run_stages(config, tmp_path)


def test_missing_flags_fail_with_usage():
    proc = subprocess.run([sys.executable, "-m", "rmsweb_jax.main"], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode != 0 and "--config" in proc.stderr


def test_bad_model_init_is_named(tmp_path):
    sys.path.insert(0, os.path.join(REPO, "configs"))
    from common import base_config
    from rmsweb_jax.models.loading import load_model
    config = base_config()
    config.model.init = "s3://bucket/model"
    with pytest.raises(ValueError, match=r"config.model.init = 's3://bucket/model'"):
        load_model(config, tmp_path)
    config.mesh.shape = (3, -1, 1)
    config.model.init = "random:tiny"
    with pytest.raises(ValueError, match=r"config.mesh.shape \(3, -1, 1\): 8 devices are not divisible by 3"):
        load_model(config, tmp_path)


@pytest.mark.parametrize("name", ["demo", "qwen3_vl_8b", "qwen3_vl_32b"])
def test_shipped_configs_are_valid(name):
    import importlib.util

    from rmsweb_jax.models import sharding
    from rmsweb_jax.models.loading import runtime_from_config
    spec = importlib.util.spec_from_file_location(name, os.path.join(REPO, "configs", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = module.get_config()
    assert set(config.stages) <= set(entry.stage_table())
    runtime_from_config(config.model)  # validates dtypes, remat policy, attention kernel
    sharding.rules_from_config(config.sharding_rules)
    assert config.model.init.startswith(("hf:", "random:"))
