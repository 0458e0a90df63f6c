"""The absl entry point: config file + overrides, stages in order, user errors as one line with exit status 2."""
import json
import os
import re
import subprocess
import sys

import pytest

from rmsweb_jax import main as entry
from rmsweb_jax.errors import UserError

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
def test_demo_config_runs_the_model_stage_with_overrides(tmp_path):
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=1")
    proc = subprocess.run(
        [sys.executable, "-m", "rmsweb_jax.main", "--config=configs/demo.py", f"--workdir={tmp_path}",
         "--config.stages=model", "--config.smoke.max_new_tokens=5", "--config.smoke.instruction=Type hello",
         "--config.prompt.history_steps=2"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((tmp_path / "model_smoke.json").read_text())
    assert report["generated_tokens"] <= 5 and report["prompt_tokens"] > 20
    assert report["image_grid_thw"][0][0] == 1
    assert (tmp_path / "checkpoints" / "random_demo" / "tokenizer.json").is_file()  # the demo's preset
    stages = json.loads((tmp_path / "stages.json").read_text())
    assert [s["stage"] for s in stages] == ["model"]
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["smoke"]["instruction"] == "Type hello"
    assert saved["prompt"]["history_steps"] == 2  # config.prompt is a real block: overridable
    assert "[model] generation" in proc.stdout


def test_unknown_stage_is_named_before_the_workdir_exists(tmp_path):
    import ml_collections
    config = ml_collections.ConfigDict({"stages": ("model", "sft_typo")})
    with pytest.raises(UserError, match=r"unknown stage\(s\) \['sft_typo'\]; known stages: \[.*'model'.*\]"):
        entry.run_stages(config, tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_comma_separated_stages_parse_through_absl_flags():
    # The real flag parser on the real config file: a comma list arrives as a one-element tuple.
    from absl import flags
    from ml_collections import config_flags
    for override, want in [("collect,sft", ["collect", "sft"]), ("model", ["model"]),
                           ("('collect','sft')", ["collect", "sft"]), (" collect , action_accuracy ",
                                                                        ["collect", "action_accuracy"])]:
        argv = ["rmsweb", f"--config={REPO}/configs/demo.py", f"--config.stages={override}"]
        values = flags.FlagValues()
        config_flags.DEFINE_config_file("config", None, "", flag_values=values, sys_argv=argv)
        values(argv)
        assert entry.stage_names(values.config.stages) == want, (override, values.config.stages)


def _main(*args, env=None, workdir):
    return subprocess.run([sys.executable, "-m", "rmsweb_jax.main", "--config=configs/demo.py", f"--workdir={workdir}",
                           *args], cwd=REPO, env=dict(os.environ, **(env or {})), capture_output=True, text=True,
                          timeout=600)


def _one_line_error(proc) -> str:
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    lines = [line for line in proc.stderr.splitlines() if line.startswith("rmsweb: error: ")]
    assert len(lines) == 1, proc.stderr[-3000:]
    return lines[0]


@pytest.mark.parametrize("args, message", [
    (["--config.stages=collect,sft_typo"], r"config.stages = \('collect,sft_typo',\) names unknown stage\(s\) "
                                           r"\['sft_typo'\]; known stages: \['action_accuracy', 'base', 'collect', "),
    (["--config.stages=('collect','sft_typo')"], r"unknown stage\(s\) \['sft_typo'\]"),
    (["--config.modle.init=random:tiny"], r"--config.modle.init=random:tiny: config has no field 'modle'; "
                                          r"did you mean config.model\?"),
    (["--config.train.batch_size=eight"], r"--config.train.batch_size=eight: expected a value of type int, as "
                                          r"config.train.batch_size = 8 in this config"),
])
def test_command_line_mistakes_exit_2_with_one_line(tmp_path, args, message):
    line = _one_line_error(_main(*args, workdir=tmp_path / "run"))
    assert re.search(message, line), line
    assert not (tmp_path / "run").exists()  # nothing is created for a command that cannot run


def test_missing_inputs_exit_2_naming_the_value(tmp_path):
    line = _one_line_error(_main("--config.stages=model", "--config.model.init=s3://bucket/model", workdir=tmp_path))
    assert "config.model.init = 's3://bucket/model': expected 'hf:/path/to/checkpoint' or 'random:<preset>'" in line
    line = _one_line_error(_main("--config.stages=model", f"--config.model.init=hf:{tmp_path}/none", workdir=tmp_path))
    assert f"model checkpoint 'hf:{tmp_path}/none': {tmp_path}/none holds no config.json" in line
    line = _one_line_error(_main("--config.stages=sft", workdir=tmp_path))
    assert f"no trajectory store at {tmp_path}/store (missing store.json)" in line


def test_a_workdir_url_of_another_scheme_is_refused_before_anything_is_written(tmp_path):
    """gs:// workdirs run every stage (tests/stages/test_gcs_workdir.py, test_gcs_recipe.py); another URL scheme is
    refused by name before anything is written (no local folder named "s3:/bucket/run")."""
    def run(workdir, stages):
        return _one_line_error(subprocess.run(
            [sys.executable, "-m", "rmsweb_jax.main", f"--config={REPO}/configs/demo.py", f"--workdir={workdir}",
             f"--config.stages={stages}"], cwd=tmp_path, env=dict(os.environ, PYTHONPATH=str(REPO)),
            capture_output=True, text=True, timeout=600))
    assert "s3:// scheme is not supported" in run("s3://bucket/run", "collect,sft,table")
    assert list(tmp_path.iterdir()) == []


def test_the_traceback_is_kept_on_request(tmp_path):
    args = ("--config.stages=model", f"--config.model.init=hf:{tmp_path}/none")
    proc = _main(*args, env={"RMSWEB_TRACEBACK": "1"}, workdir=tmp_path)
    assert proc.returncode == 1 and "Traceback" in proc.stderr and "rmsweb_jax.errors.UserError" in proc.stderr
    proc = _main(*args, "--verbosity=1", workdir=tmp_path)
    assert proc.returncode == 1 and "Traceback" in proc.stderr


def test_missing_flags_fail_with_usage():
    proc = subprocess.run([sys.executable, "-m", "rmsweb_jax.main"], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2 and "--config" in proc.stderr and "Traceback" not in proc.stderr


def test_bad_model_init_is_named(tmp_path):
    from configs.common import base_config
    from rmsweb_jax.model_init import load_model
    config = base_config()
    config.model.init = "s3://bucket/model"
    with pytest.raises(UserError, match=r"config.model.init = 's3://bucket/model'"):
        load_model(config, tmp_path)
    config.mesh.shape = (3, -1, 1)
    config.model.init = "random:tiny"
    with pytest.raises(ValueError, match=r"config.mesh.shape \(3, -1, 1\): 8 devices are not divisible by 3"):
        load_model(config, tmp_path)


@pytest.mark.parametrize("name", ["demo", "qwen3_vl_8b", "qwen3_vl_32b"])
def test_shipped_configs_are_valid(name):
    import importlib.util

    from rmsweb_jax.models import sharding
    from rmsweb_jax.models.from_config import runtime_from_config
    spec = importlib.util.spec_from_file_location(name, os.path.join(REPO, "configs", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = module.get_config()
    assert entry.stage_names(config.stages) == list(config.stages)
    assert set(entry.stage_table()) == set(entry.STAGES)  # every stage module imports and has run()
    runtime_from_config(config.model)  # validates dtypes, remat policy, attention kernel
    sharding.rules_from_config(config.sharding_rules)
    assert config.model.init.startswith(("hf:", "random:"))


def test_the_demo_runs_the_whole_recipe_and_its_argument_is_the_run_seed():
    from rmsweb_jax.stages.train_overrides import with_train_overrides
    from configs.demo import get_config
    config = get_config()
    assert entry.stage_names(config.stages) == ["model", "collect", "ground", "sft", "mine", "salvage", "eval",
                                                "table"]
    assert config.sft.init == "ground"  # SFT starts from the grounded checkpoint (issue 26)
    assert set(config.eval.policies.split(",")) >= {"sft", "salvage"}  # the table's policy rows
    # Salvage-DS trains with its own batch, with room for anchor rows beside B x G policy rows.
    salvage = with_train_overrides(config, "salvage").train
    assert salvage.batch_size > config.salvage.groups_per_step * config.salvage.group_size
    assert salvage.optimizer.total_steps < config.train.optimizer.total_steps
    one, two = get_config("1"), get_config("2")
    assert (one.seed, one.collect.teacher.seed, one.collect.first_seed) == (1, 1, 1000)
    assert two.collect.first_seed + two.collect.num_seeds <= config.eval.first_seed  # training seeds stay below
    assert one.eval.first_seed == config.eval.first_seed  # the same held-out seeds for every run
    with pytest.raises(ValueError, match=r"configs/demo.py:x: the argument is the run seed"):
        get_config("x")
    with pytest.raises(ValueError, match=r"must be in 0..99"):
        get_config("100")
