"""Stage manifests: a stage whose manifest is complete, whose config fields and input stages are unchanged
and whose outputs are there is skipped; otherwise it reruns, saying why, and so do the stages after it.
Real stages (the model smoke stage, a teacher collection in Chromium, and, slow, the micro pipeline
collect -> sft -> mine -> salvage -> eval) on real workdirs."""
import ast
import json
import pathlib
import re
import shutil

import pytest

from configs.common import base_config
from rmsweb_jax.errors import UserError
from rmsweb_jax.main import STAGES, run_stages, stage_module
from rmsweb_jax.stages import manifest
from tests.stages.micro_pipeline import micro_pipeline_config


def _ran(workdir: pathlib.Path) -> dict[str, bool]:
    """Returns {stage: whether the last run_stages ran it (False: skipped)} from workdir/stages.json."""
    return {r["stage"]: r["ran"] for r in json.loads((workdir / "stages.json").read_text())}


def _reasons(workdir: pathlib.Path) -> dict[str, str]:
    return {r["stage"]: r["reason"] for r in json.loads((workdir / "stages.json").read_text())}


def test_every_stage_declares_what_it_reads_in_the_config_and_from_which_stages():
    config = base_config()
    leaves = set(manifest.flatten(json.loads(config.to_json())))
    for name in STAGES:
        decl = manifest.Declaration.of(name, stage_module(name))
        for path in decl.config_reads:  # each declared section or field exists in the defaults
            assert path in config or any(leaf == path or leaf.startswith(path + ".") for leaf in leaves), (name, path)
        assert set(decl.input_stages) <= set(STAGES) - {name}, name
        for key in [*decl.input_stages.values(), *decl.outputs.values()]:
            value = None if key is None else manifest.lookup(config, key)  # a string field: "" = the default path
            assert key is None or (isinstance(value, str) and value != manifest.MISSING), (name, key)
        assert decl.outputs, name
    # MODEL_LOADING is config.model without model.init, plus the mesh and the rules.
    assert set(manifest.MODEL_LOADING) == {f"model.{k}" for k in config.model if k != "init"} | {
        "mesh", "sharding_rules"}


_NOT_FIELDS = {"get", "copy_and_resolve_references", "to_dict", "to_json_best_effort"}


def _config_reads_in_code(path: pathlib.Path) -> set[str]:
    """Returns the config fields a module's code reads directly (`config.x`, `config.x.y`, `config.get("x")`),
    as dotted paths of at most two parts; strings and docstrings are not code."""
    tree = ast.parse(path.read_text())
    inner = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get" \
                and isinstance(node.func.value, ast.Name) and node.func.value.id == "config":
            found.add(node.args[0].value)
        if not isinstance(node, ast.Attribute) or id(node) in inner:
            continue
        chain = []
        while isinstance(node, ast.Attribute):
            chain.insert(0, node.attr)
            node = node.value
        if isinstance(node, ast.Name) and node.id == "config":
            chain = [c for c in chain if c not in _NOT_FIELDS][:2]
            if chain:
                found.add(".".join(chain))
    return found


# modules of rmsweb_jax/stages that every stage runs through, not a part of one stage's own code
_INFRASTRUCTURE = {"manifest", "links", "pipeline"}


def _helpers_of(path: pathlib.Path) -> list[pathlib.Path]:
    """Returns the non-stage modules of rmsweb_jax/stages that the module at `path` imports (e.g. sft_split.py,
    which holds the sft stage's reading of config.data and which mine and action_accuracy also call)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module == "rmsweb_jax.stages":
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("rmsweb_jax.stages."):
            names.add(node.module.rsplit(".", 1)[1])
    return [path.with_name(f"{n}.py") for n in sorted(names - set(STAGES) - _INFRASTRUCTURE)
            if path.with_name(f"{n}.py").is_file()]


def test_each_stage_declares_every_config_field_its_own_code_reads():
    for name, module in STAGES.items():
        decl = manifest.Declaration.of(name, stage_module(name))
        path = pathlib.Path(stage_module(name).__file__)
        used = set().union(*(_config_reads_in_code(p) for p in [path, *_helpers_of(path)]))
        assert used, name  # the walk finds something in every stage
        undeclared = [u for u in sorted(used) if not any(u == d or u.startswith(d + ".") for d in decl.config_reads)]
        assert not undeclared, (name, undeclared)


def test_a_stage_with_an_override_key_depends_on_its_input_only_through_the_default_path():
    config = base_config()
    salvage = manifest.Declaration.of("salvage", stage_module("salvage"))
    evaluation = manifest.Declaration.of("eval", stage_module("eval"))
    assert manifest.input_stages(salvage, config) == ["mine", "sft"]
    config.salvage.states, config.salvage.init = "/data/states.arrayrecord", "hf:/ckpt/sft"
    assert manifest.input_stages(salvage, config) == []
    config.eval.policies = "teacher,tuned=salvage"
    assert manifest.input_stages(evaluation, config) == ["collect", "salvage"]
    config.eval.policies, config.eval.training_store = "sft,hf:/ckpt/salvage/hf", "none"
    assert manifest.input_stages(evaluation, config) == ["sft"]
    collect = manifest.Declaration.of("collect", stage_module("collect"))
    config.collect.store_dir = "/data/store"
    assert manifest.output_paths(collect, config, pathlib.Path("/w"))["store"] == pathlib.Path("/data/store")


def _chain(tmp_path):
    """Two stages declared as a test would: `first` writes out/a.txt, `second` reads it unless second.source is set."""
    first = manifest.Declaration("first", ("first",), {}, {"out/a.txt": None})
    second = manifest.Declaration("second", ("second",), {"first": "second.source"}, {"b.txt": None})
    import ml_collections
    config = ml_collections.ConfigDict({"first": {"n": 1}, "second": {"m": 2, "source": ""}})

    def run(decl, content):
        begun = manifest.started(decl, config, tmp_path)
        for rel in decl.outputs:
            (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / rel).write_text(content)
        return manifest.completed(decl, begun, config, tmp_path, 0.1)
    return first, second, config, run


def test_a_rerun_of_an_input_stage_reruns_its_dependants_and_a_deleted_input_reruns_them(tmp_path):
    first, second, config, run = _chain(tmp_path)
    decide = lambda decl: manifest.decide(decl, config, tmp_path, forced=False)  # noqa: E731
    assert decide(first).run and "first run in this workdir" in decide(first).reason
    run(first, "a")
    done = run(second, "b")
    assert done["inputs"] == {"first": manifest.manifest_digest(tmp_path, "first")} and done["complete"]
    assert done["outputs"]["b.txt"]["sha256"] and done["config"] == {"second": {"m": 2, "source": ""}}
    assert not decide(first).run and not decide(second).run
    assert decide(second).reason.startswith("up to date") and "inputs first unchanged" in decide(second).reason

    run(first, "a")  # the same output again, but a rerun: the dependant reruns
    assert not decide(first).run
    assert re.fullmatch(r"input stage first reran \(finished .*\)", decide(second).reason)
    run(second, "b")
    (tmp_path / "out" / "a.txt").unlink()  # the input's output deleted
    assert decide(first).reason.startswith("its output out/a.txt is missing")
    assert decide(second).reason.startswith("input stage first's output out/a.txt is missing")
    run(first, "a")
    run(second, "b")
    (tmp_path / "b.txt").write_text("edited")
    assert decide(second).reason.startswith("its output b.txt changed since it completed")
    run(second, "b")

    config.second.m = 3
    assert decide(second).reason == "config changed: second.m (2 -> 3)"
    run(second, "b")
    config.second.source = "/elsewhere/a.txt"  # the input replaced by a path: no dependency on `first`
    assert decide(second).reason.startswith("config changed: second.source")
    run(second, "b")
    assert manifest.read_manifest(tmp_path, "second")["inputs"] == {}
    shutil.rmtree(tmp_path / "out")
    assert decide(first).run and not decide(second).run
    config.second.source = ""
    assert decide(second).reason.startswith("config changed")
    manifest.manifest_path(tmp_path, "first").unlink()
    run(second, "b")
    assert decide(second).reason == "input stage first has no manifest (deleted, or first never ran here)"
    manifest.started(first, config, tmp_path)  # a run that never completed
    assert re.fullmatch(r"its last run \(started .*\) did not complete: resuming", decide(first).reason)
    assert not decide(first).fresh  # an interrupted run resumes its own state
    config.first.n = 3  # ... unless a field it read changed since: then its state is stale
    assert decide(first).reason.startswith("config changed: first.n") and decide(first).fresh
    assert decide(second).reason.startswith("input stage first did not complete")


def _model_config():
    c = base_config()
    c.stages = ("model",)
    c.mesh.shape = (1, 1, 1)
    c.smoke.max_new_tokens = 4
    return c


def test_the_model_stage_is_skipped_when_up_to_date_and_reruns_on_a_change_a_deletion_or_a_request(tmp_path,
                                                                                                    capsys):
    config = _model_config()
    run_stages(config, tmp_path)
    out = capsys.readouterr().out
    assert "[model] running: no manifest" in out and "[model] generation" in out
    first = manifest.read_manifest(tmp_path, "model")
    assert first["complete"] and first["config"]["smoke"]["max_new_tokens"] == 4 and first["seconds"] > 0
    assert set(first["config"]) == {"smoke", "model", "mesh", "sharding_rules", "seed"}
    assert first["outputs"]["model_smoke.json"]["path"] == str(tmp_path / "model_smoke.json")

    run_stages(config, tmp_path)
    out = capsys.readouterr().out
    assert re.search(r"^\[model\] skipped: up to date \(completed .*; config unchanged, no input stages, 1 outputs "
                     r"present\)$", out, re.M) and "[model] generation" not in out
    assert _ran(tmp_path) == {"model": False} and manifest.read_manifest(tmp_path, "model") == first

    config.smoke.max_new_tokens = 5
    run_stages(config, tmp_path)
    assert "[model] running: config changed: smoke.max_new_tokens (4 -> 5)" in capsys.readouterr().out
    assert manifest.read_manifest(tmp_path, "model")["config"]["smoke"]["max_new_tokens"] == 5
    decl = manifest.Declaration.of("model", stage_module("model"))
    assert not manifest.decide(decl, config, tmp_path, forced=False).run
    assert manifest.decide(decl, config, tmp_path, forced=True).reason == "forced by config.rerun"
    (tmp_path / "model_smoke.json").unlink()
    assert manifest.decide(decl, config, tmp_path, forced=False).reason.startswith(
        "its output model_smoke.json is missing")
    assert manifest.forced_stages("all", ["model", "sft"], STAGES) == {"model", "sft"}
    assert manifest.forced_stages(("sft,model",), ["model", "sft"], STAGES) == {"model", "sft"}
    assert manifest.forced_stages("", ["model"], STAGES) == set()
    for bad, message in [("mine", r"names \['mine'\], not among config.stages \['model'\]"),
                         ("model,mnie", r"unknown stage\(s\) \['mnie'\]; expected 'all' or comma-separated")]:
        config.rerun = bad
        with pytest.raises(UserError, match=message):
            run_stages(config, tmp_path)


def test_an_interrupted_stage_reruns_and_its_failure_leaves_the_manifest_incomplete(tmp_path):
    config = _model_config()
    config.model.init = "hf:/no/such/checkpoint"
    with pytest.raises(UserError, match="holds no config.json"):
        run_stages(config, tmp_path)
    assert manifest.read_manifest(tmp_path, "model")["complete"] is False
    with pytest.raises(UserError, match="holds no config.json"):
        run_stages(config, tmp_path)
    assert re.fullmatch(r"its last run \(started .*\) did not complete: resuming", _reasons(tmp_path)["model"])


@pytest.mark.browser
def test_a_teacher_collection_is_skipped_when_done_and_resumes_when_a_field_grows(tmp_path, capsys):
    config = base_config()
    config.stages = ("collect",)
    config.collect.tasks, config.collect.num_seeds, config.collect.attempts = "click-test", 1, 1
    config.collect.workers, config.collect.max_steps, config.collect.progress = 1, 3, False
    run_stages(config, tmp_path)
    done = manifest.read_manifest(tmp_path, "collect")
    assert set(done["outputs"]) == {"store", "collect_report.json"}  # no viewer asked for
    assert done["outputs"]["store"]["kind"] == "folder" and done["outputs"]["store"]["files"] > 0
    capsys.readouterr()
    run_stages(config, tmp_path)
    assert "[collect] skipped: up to date" in capsys.readouterr().out and _ran(tmp_path) == {"collect": False}
    config.collect.num_seeds = 2
    run_stages(config, tmp_path)
    out = capsys.readouterr().out
    assert "[collect] running: config changed: collect.num_seeds (1 -> 2)" in out
    assert "1 task groups collected, 1 already in the store" in out  # it resumed


@pytest.mark.slow
@pytest.mark.browser
def test_the_micro_pipeline_reruns_exactly_the_stages_after_a_change(tmp_path, capsys):
    stages = ["collect", "sft", "mine", "salvage", "eval"]
    config = micro_pipeline_config()
    run_stages(config, tmp_path)
    assert _ran(tmp_path) == dict.fromkeys(stages, True)
    assert (tmp_path / "eval" / "eval_report.json").is_file() and (tmp_path / "salvage" / "hf").is_dir()
    digests = {s: manifest.manifest_digest(tmp_path, s) for s in stages}
    assert manifest.read_manifest(tmp_path, "eval")["inputs"] == {s: digests[s] for s in ("collect", "sft",
                                                                                            "salvage")}
    assert manifest.read_manifest(tmp_path, "salvage")["inputs"] == {s: digests[s] for s in ("mine", "sft")}

    capsys.readouterr()
    run_stages(config, tmp_path)  # a finished workdir: nothing is redone
    out = capsys.readouterr().out
    assert _ran(tmp_path) == dict.fromkeys(stages, False)
    assert all(f"[{s}] skipped: up to date" in out for s in stages)
    assert {s: manifest.manifest_digest(tmp_path, s) for s in stages} == digests

    shutil.rmtree(tmp_path / "mine")
    run_stages(config, tmp_path)
    assert _ran(tmp_path) == {"collect": False, "sft": False, "mine": True, "salvage": True, "eval": True}
    reasons = _reasons(tmp_path)
    assert reasons["mine"].startswith("its output mine/") and "is missing" in reasons["mine"]
    assert reasons["salvage"].startswith("input stage mine reran") and reasons["eval"].startswith(
        "input stage salvage reran")
    assert (tmp_path / "mine" / "states.arrayrecord").is_file()
    # salvage reran because its input changed: its old folder was set aside and it trained from step 0
    (stale,) = (tmp_path / "stale").glob("salvage-*")
    assert (stale / "salvage" / "summary.json").is_file()
    summary = json.loads((tmp_path / "salvage" / "summary.json").read_text())
    assert summary["resumed_from"] in (None, 0) and summary["steps"] == config.train.optimizer.total_steps, summary

    config.salvage.temperature = 0.7
    run_stages(config, tmp_path)
    assert _ran(tmp_path) == {"collect": False, "sft": False, "mine": False, "salvage": True, "eval": True}
    assert _reasons(tmp_path)["salvage"] == "config changed: salvage.temperature (1.0 -> 0.7)"
    run_stages(config, tmp_path)
    assert _ran(tmp_path) == dict.fromkeys(stages, False)


def test_a_stage_rerun_for_a_change_has_its_training_folders_set_aside_not_deleted(tmp_path):
    decl = manifest.Declaration("sft", ("sft",), {}, {"sft/summary.json": None}, fresh_start=("sft", "absent"))
    (tmp_path / "sft" / "checkpoints").mkdir(parents=True)
    (tmp_path / "sft" / "checkpoints" / "step_2").write_text("weights")
    moved = manifest.set_aside(decl, tmp_path)
    assert moved.parent == tmp_path / manifest.STALE_DIR and moved.name.startswith("sft-")
    assert (moved / "sft" / "checkpoints" / "step_2").read_text() == "weights"
    assert not (tmp_path / "sft").exists() and not (moved / "absent").exists()
    assert manifest.set_aside(decl, tmp_path) is None  # nothing left to move
