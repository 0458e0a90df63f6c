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
from configs.demo import get_config as demo_config
from rmsweb_jax.durable import file_sha256
from rmsweb_jax.errors import UserError
from rmsweb_jax.main import STAGES, run_stages, stage_module
from rmsweb_jax.stages import manifest
from rmsweb_jax.train.metrics import loss_summary
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
    config.collect.workers, config.collect.progress = 2, demo_config().collect.progress  # the demo's: a bar
    run_stages(config, tmp_path)
    assert re.search(r"^\[collect\] skipped: done \(completed .*\): only fields that cannot change results changed, "
                     r"now recorded: collect.progress \(false -> true\), collect.workers \(1 -> 2\); no input stages, "
                     r"2 outputs present$", capsys.readouterr().out, re.M)
    assert manifest.read_manifest(tmp_path, "collect")["settings"]["collect.workers"] == 2
    config.collect.num_seeds = 2
    run_stages(config, tmp_path)
    out, err = capsys.readouterr()
    assert "[collect] running: config changed: collect.num_seeds (1 -> 2)\n" in out  # the result field alone
    assert "1 task groups collected, 1 already in the store" in out  # it resumed
    assert re.search(r"collect: 100%.* 1/1 ", err), err  # the progress bar the demo config shows


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

    # Logging cadence, checkpoint cadence, progress, workers, the viewer: no stage reruns; each names those it reads.
    config.train.metrics.every_steps, config.train.checkpoint.keep = 2, 1
    config.collect.progress, config.collect.workers, config.eval.viewer = True, 1, True
    digests = {s: manifest.manifest_digest(tmp_path, s) for s in stages}
    run_stages(config, tmp_path)
    assert _ran(tmp_path) == dict.fromkeys(stages, False)
    reasons = _reasons(tmp_path)
    browser = "collect.progress (false -> true), collect.workers (2 -> 1)"
    trainer = "train.checkpoint.keep (3 -> 1), train.metrics.every_steps (1 -> 2)"
    for stage, changed in {"collect": browser, "mine": browser, "sft": trainer, "salvage": trainer,
                           "eval": browser + ", eval.viewer (false -> true)"}.items():
        assert reasons[stage].startswith("done (completed "), (stage, reasons[stage])
        assert f"changed, now recorded: {changed};" in reasons[stage], (stage, reasons[stage])
    assert {s: manifest.manifest_digest(tmp_path, s) for s in stages} == digests
    run_stages(config, tmp_path)
    assert all(r.startswith("up to date") for r in _reasons(tmp_path).values()), _reasons(tmp_path)


def test_a_stage_rerun_for_a_change_has_its_training_folders_set_aside_not_deleted(tmp_path):
    decl = manifest.Declaration("sft", ("sft",), {}, {"sft/summary.json": None}, fresh_start=("sft", "absent"))
    (tmp_path / "sft" / "checkpoints").mkdir(parents=True)
    (tmp_path / "sft" / "checkpoints" / "step_2").write_text("weights")
    moved = manifest.set_aside(decl, tmp_path)
    assert moved.parent == tmp_path / manifest.STALE_DIR and moved.name.startswith("sft-")
    assert (moved / "sft" / "checkpoints" / "step_2").read_text() == "weights"
    assert not (tmp_path / "sft").exists() and not (moved / "absent").exists()
    assert manifest.set_aside(decl, tmp_path) is None  # nothing left to move


def test_each_stage_tells_the_fields_that_cannot_change_results_from_the_others():
    config = base_config()
    declared = {name: manifest.Declaration.of(name, stage_module(name)) for name in STAGES}
    for name, decl in declared.items():
        for path in decl.non_result:  # a field or block of the defaults, under a section or field the stage reads
            assert manifest.lookup(config, path) != manifest.MISSING, (name, path)
            assert any(path == r or path.startswith(r + ".") for r in decl.config_reads), (name, path)
    trainer, browser = set(manifest.TRAINER_CADENCE), set(manifest.COLLECT_RUNTIME)
    assert {n: set(d.non_result) for n, d in declared.items()} == {
        "model": set(), "action_accuracy": set(), "transfer": set(), "train_smoke": trainer, "ground": trainer,
        "base": trainer | {"base.probe_every"},
        "sft": trainer, "salvage": trainer,
        "collect": browser, "mine": browser, "eval": browser | {"eval.viewer"},
        "table": trainer | browser | {"eval.viewer"}}
    for field in ("train.metrics.every_steps", "train.metrics.wandb", "train.checkpoint.every_steps",
                  "train.checkpoint.keep", "train.profile_steps"):
        assert declared["sft"].is_non_result(field) and declared["salvage"].is_non_result(field), field
    for field in ("collect.progress", "collect.workers", "collect.viewer", "eval.viewer"):
        assert declared["eval"].is_non_result(field), field
    # results: the optimizer, the data order, and data.worker_count (the checkpointed Grain iterator state)
    assert not any(declared["sft"].is_non_result(f) for f in ("train.optimizer.lr", "data.seed", "data.worker_count"))


def test_a_change_that_cannot_change_results_resumes_or_skips_and_the_next_run_compares_with_it(tmp_path):
    first = manifest.Declaration("first", ("first",), {}, {"a.txt": None}, non_result=("first.every",))
    second = manifest.Declaration("second", ("second",), {"first": None}, {"b.txt": None})
    import ml_collections
    config = ml_collections.ConfigDict({"first": {"n": 1, "every": 10}, "second": {"m": 2}})

    def run(decl):
        begun = manifest.started(decl, config, tmp_path)
        (tmp_path / next(iter(decl.outputs))).write_text(decl.stage)
        return manifest.completed(decl, begun, config, tmp_path, 0.1)
    decide = lambda decl: manifest.decide(decl, config, tmp_path, forced=False)  # noqa: E731
    done = run(first)
    assert done["config"] == {"first": {"n": 1}} and done["settings"] == {"first.every": 10}
    run(second)
    digest = manifest.manifest_digest(tmp_path, "first")

    config.first.every = 20  # completed: skipped as done, the new value recorded, the dependant unaffected
    decision = decide(first)
    assert not decision.run and decision.settings_changed and not decision.fresh
    assert re.fullmatch(r"done \(completed .*\): only fields that cannot change results changed, now recorded: "
                        r"first.every \(10 -> 20\); no input stages, 1 outputs present", decision.reason)
    assert manifest.record_settings(first, config, tmp_path)["settings"] == {"first.every": 20}
    assert manifest.manifest_digest(tmp_path, "first") == digest
    assert decide(first).reason.startswith("up to date") and decide(second).reason.startswith("up to date")

    manifest.started(first, config, tmp_path)  # interrupted, then a cadence change: it resumes, not afresh
    config.first.every = 5
    decision = decide(first)
    assert decision.run and not decision.fresh
    assert re.fullmatch(r"its last run \(started .*\) did not complete: resuming; only fields that cannot change "
                        r"results changed: first.every \(20 -> 5\)", decision.reason)
    config.first.n = 2  # with a field that can change results: afresh, naming that field only
    assert decide(first).reason == "config changed: first.n (1 -> 2)" and decide(first).fresh

    # A manifest written before the settings were kept apart: its "config" holds them; its digest still holds.
    config.first.n, config.first.every = 1, 10
    run(first)
    legacy = {k: v for k, v in manifest.read_manifest(tmp_path, "first").items() if k != "settings"}
    legacy["config"] = {"first": {"n": 1, "every": 10}}
    manifest.write_json_atomic(manifest.manifest_path(tmp_path, "first"), legacy)
    run(second)
    assert manifest.read_manifest(tmp_path, "second")["inputs"]["first"] == file_sha256(
        manifest.manifest_path(tmp_path, "first"))
    assert decide(first).reason.startswith("up to date")
    config.first.every = 30
    assert decide(first).settings_changed and "first.every (10 -> 30)" in decide(first).reason
    manifest.record_settings(first, config, tmp_path)
    assert decide(first).reason.startswith("up to date") and decide(second).reason.startswith("up to date")


def _train_smoke_config():
    c = _model_config()
    c.stages = ("train_smoke",)
    c.model.init = "random:tiny"
    c.train.batch_size, c.train.optimizer.total_steps, c.train.optimizer.warmup_steps = 4, 2, 1
    c.train.checkpoint.every_steps, c.train.checkpoint.async_save = 2, False
    return c


@pytest.mark.slow  # ~40 s: a tiny model trained 2 steps, then a resume
def test_a_trainer_stage_skips_or_resumes_after_a_cadence_change_and_says_what_its_loss_is(tmp_path, capsys):
    config = _train_smoke_config()
    run_stages(config, tmp_path)
    out = "".join(capsys.readouterr())
    # metrics.every_steps 10 > 2 steps: one logged loss, the mean of both steps; the bar's is one step's
    assert "[train] step 2: loss (mean of steps 1-2) " in out and "loss (step 2 alone) " in out
    summary = loss_summary(tmp_path / "train_smoke" / "metrics.jsonl")
    assert summary["windows"] == 1 and summary["first_steps"] == summary["last_steps"] == [1, 2]
    assert re.fullmatch(r"loss \d+\.\d{3} \(mean of steps 1-2, the only logged window: no trend\)", summary["text"])
    digest = manifest.manifest_digest(tmp_path, "train_smoke")

    config.train.metrics.every_steps, config.train.checkpoint.keep = 1, 2
    run_stages(config, tmp_path)
    out = capsys.readouterr().out
    assert re.search(r"^\[train_smoke\] skipped: done \(completed .*\): only fields that cannot change results "
                     r"changed, now recorded: train.checkpoint.keep \(3 -> 2\), train.metrics.every_steps \(10 -> 1\); "
                     r"no input stages, 2 outputs present$", out, re.M), out
    recorded = manifest.read_manifest(tmp_path, "train_smoke")
    assert recorded["settings"]["train.metrics"]["every_steps"] == 1 and "metrics" not in recorded["config"]["train"]
    assert "checkpoint" not in recorded["config"]["train"] and "optimizer" in recorded["config"]["train"]
    assert manifest.manifest_digest(tmp_path, "train_smoke") == digest
    run_stages(config, tmp_path)
    assert "[train_smoke] skipped: up to date" in capsys.readouterr().out

    decl = manifest.Declaration.of("train_smoke", stage_module("train_smoke"))
    manifest.started(decl, config, tmp_path)  # as if the run had been stopped before it completed
    config.train.checkpoint.every_steps = 1
    run_stages(config, tmp_path)
    out = capsys.readouterr().out
    assert re.search(r"^\[train_smoke\] running: its last run \(started .*\) did not complete: resuming; only fields "
                     r"that cannot change results changed: train.checkpoint.every_steps \(2 -> 1\)$", out, re.M), out
    assert "starting afresh" not in out and not (tmp_path / manifest.STALE_DIR).exists()
    assert json.loads((tmp_path / "train_smoke" / "summary.json").read_text())["resumed_from"] == 2
    assert manifest.read_manifest(tmp_path, "train_smoke")["complete"]
