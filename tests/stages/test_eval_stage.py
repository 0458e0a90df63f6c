"""The eval stage: the CI micro evaluation (two MiniWoB++ tasks, the scripted teacher and the tiny random
model, real Chromium) with its figures recomputed from the stores; the refusals (seeds in the training
store, unknown policies, an empty list, a missing sft export, bad comparisons, changed settings); resume."""
import json
import pathlib
import re

import pytest

from configs.common import base_config
from rmsweb_jax.collect.store import TrajectoryStore
from rmsweb_jax.collect.store_fixture import task_group
from rmsweb_jax.errors import UserError
from rmsweb_jax.evaluate.stats import mcnemar_exact, wilson_interval
from rmsweb_jax.main import run_stages
from rmsweb_jax.sampling.chat_model import checkpoint_name
from rmsweb_jax.stages import eval as eval_stage
from rmsweb_jax.train.metrics import MetricsWriter
from tests.settings import store_writer

TASKS = ("miniwob.click-test", "miniwob.click-button")


def _config(**eval_fields):
    c = base_config()
    c.mesh.shape = (1, 1, 1)
    c.collect.tasks = ",".join(t.split(".", 1)[1] for t in TASKS)
    c.collect.progress = False
    c.collect.workers = 2
    c.stages = ("eval",)
    for key, value in eval_fields.items():
        c.eval[key] = value
    return c


def _training_store(directory: pathlib.Path, seeds) -> pathlib.Path:
    with store_writer(directory) as store:
        for task in TASKS:
            for s in seeds:
                store.add_group(task_group(task, s, fail_first=False, viewport=(500, 240), variant=s))
    return directory


REFUSALS = {  # id: (config.eval fields, the UserError's message); "{tmp}" is the test's workdir
    "seeds_trained_on": (dict(policies="teacher", first_seed=1, num_seeds=3), re.escape(
        "4 (task, seed) pairs were trained on, e.g. [('miniwob.click-button', 1), ('miniwob.click-button', 2), "
        "('miniwob.click-test', 1)]") + ".*--config.eval.first_seed=3"),
    "no_training_store": (dict(policies="teacher", first_seed=1, num_seeds=3, training_store="{tmp}/elsewhere"),
                          r"no trajectory store at .*elsewhere .*training_store=/path/to/store.*'none'"),
    "unknown_policy": (dict(policies="gpt:4", first_seed=3),
                       r"eval.policies 'gpt:4': unknown policy; expected one of sft, salvage, teacher, hf:/path"),
    "empty_policies": (dict(policies=" , ", first_seed=3), r"eval.policies is empty"),
    "no_sft_export": (dict(policies="sft,teacher", first_seed=3), r"names 'sft' but .*sft/hf holds no HF export .*run the sft stage"),
    "no_hf_checkpoint": (dict(policies="hf:/no/such/ckpt", first_seed=3),
                         r"eval.policies 'hf:/no/such/ckpt': /no/such/ckpt holds no HF checkpoint"),
    "label_twice": (dict(policies="teacher,teacher", first_seed=3),
                    r"both labelled 'teacher'; label one of them: '<label>=teacher'"),
    "bad_label": (dict(policies="a b=teacher", first_seed=3), r"label 'a b' may hold only letters"),
    "http_without_model": (dict(policies="http:http://127.0.0.1:9/v1", first_seed=3), r"expected 'http:<base_url>#<model>'"),
    "compare_unknown_label": (dict(policies="ref=teacher", compare="ref:b", first_seed=3),
                              r"eval.compare 'ref:b': \['b'\] not among the policies' labels \['ref'\]"),
    "no_seeds": (dict(policies="teacher", num_seeds=0), r"eval.num_seeds must be an int >= 1, got 0"),
}


@pytest.mark.parametrize("eval_fields, message", REFUSALS.values(), ids=REFUSALS.keys())
def test_the_stage_refuses_what_cannot_be_an_honest_evaluation(tmp_path, eval_fields, message):
    _training_store(tmp_path / "store", seeds=range(3))
    fields = {k: v.format(tmp=tmp_path) if isinstance(v, str) else v for k, v in eval_fields.items()}
    with pytest.raises(UserError, match=message):
        run_stages(_config(**fields), tmp_path)
    assert not (tmp_path / "eval").exists()  # nothing was played or written


def test_live_suites_are_refused_by_task_id_and_comparisons_read_their_setting(tmp_path, capsys):
    # Live suites cannot be seeded apart: a task id seen in training is refused whatever the seed.
    with pytest.raises(UserError, match=r"live webvoyager suite .* 1 task ids, e.g. \['wv.1'\]"):
        eval_stage.check_disjoint([("wv.1", 7), ("wv.2", 7)], {("wv.1", 0)}, "webvoyager", "store")
    eval_stage.check_disjoint([("wv.2", 0)], {("wv.1", 0)}, "webvoyager", "store")
    config = _config(policies="teacher", first_seed=1, num_seeds=3, training_store="none")
    eval_stage.check_training_seeds(config, tmp_path, [(TASKS[0], 1)], "miniwob")
    assert "NOT checked against the seeds" in capsys.readouterr().out
    assert eval_stage.comparisons("", ["a", "b", "c"]) == [("a", "b"), ("a", "c")]
    assert eval_stage.comparisons("c:b", ["a", "b", "c"]) == [("c", "b")]


def _episodes(store_dir, pairs):
    return {k: g[0] for k, g in TrajectoryStore(store_dir).groups().items() if k in pairs}


@pytest.mark.slow  # ~40 s at load 9 on the 2-core machine (the tiny model's compiles)
@pytest.mark.browser
def test_micro_evaluation_of_the_teacher_and_the_tiny_model(tmp_path, capsys):
    # The training store is a real collection (2 tasks x seeds 0-1), which also writes its viewer.
    config = _config(policies="teacher,tiny=flax:random:tiny", first_seed=1, num_seeds=2, max_steps=3,
                     max_new_tokens=8, bootstrap_samples=500)
    config.stages = ("collect",)
    config.collect.attempts = 1
    config.collect.num_seeds = 2
    config.collect.viewer = True
    run_stages(config, tmp_path)
    assert (tmp_path / "collect_viewer" / "index.html").is_file()

    config.stages = ("eval",)
    with pytest.raises(UserError, match=re.escape("[('miniwob.click-button', 1), ('miniwob.click-test', 1)]")):
        run_stages(config, tmp_path)
    config.eval.first_seed = 2
    run_stages(config, tmp_path)
    out = capsys.readouterr().out
    out_dir = tmp_path / "eval"
    report = json.loads((out_dir / "eval_report.json").read_text())
    assert (out_dir / "eval_report.md").is_file() and (out_dir / "eval_report.png").is_file()
    assert (out_dir / "viewer" / "index.html").is_file()
    assert not (out_dir / "training_curves.png").exists()  # no sft / salvage logs in this workdir

    pairs = {(t, s) for t in TASKS for s in (2, 3)}
    rows = {p["label"]: p for p in report["policies"]}
    tiny_digest = checkpoint_name(tmp_path / "checkpoints" / "random_tiny").rpartition("@")[2]
    assert rows["tiny"]["id"] == f"tiny@{tiny_digest}"
    assert rows["teacher"]["id"].startswith("teacher@") and rows["teacher"]["id"] != rows["tiny"]["id"]
    episodes = {}
    for label, row in rows.items():
        store_dir = out_dir / row["id"] / "store"
        assert row["store_dir"] == str(store_dir)
        episodes[label] = eps = _episodes(store_dir, pairs)
        assert set(eps) == pairs and all(t.attempt == 1 and not t.reflections for t in eps.values())
        assert all(1 <= t.num_steps <= 3 for t in eps.values())
        solved = sum(t.success for t in eps.values())
        overall = row["overall"]
        assert (overall["episodes"], overall["solved"]) == (4, solved)
        assert overall["ci95"] == pytest.approx(wilson_interval(solved, 4))
        steps = [t.num_steps for t in eps.values() if t.success]
        assert overall["mean_steps_solved"] == (pytest.approx(sum(steps) / len(steps)) if steps else None)
        for task in TASKS:
            k = sum(eps[(task, s)].success for s in (2, 3))
            assert row["tasks"][task]["solved"] == k and row["tasks"][task]["success"] == k / 2
        assert f"[eval] {row['id']}: {solved}/4 solved" in out
    assert episodes["teacher"][(TASKS[0], 2)].policy == "scripted-teacher"
    assert episodes["tiny"][(TASKS[0], 2)].policy == f"flax:random_tiny@{tiny_digest}"
    # The tiny random model emits no valid action, so it solves nothing; the teacher solves some.
    assert rows["tiny"]["overall"]["solved"] == 0 and rows["teacher"]["overall"]["solved"] >= 1

    (comparison,) = report["comparisons"]
    a, b = episodes["teacher"], episodes["tiny"]
    only_a = sum(a[k].success and not b[k].success for k in pairs)
    only_b = sum(b[k].success and not a[k].success for k in pairs)
    assert (comparison["a"], comparison["b"], comparison["n"]) == ("teacher", "tiny", 4)
    assert (comparison["mcnemar"]["b"], comparison["mcnemar"]["c"]) == (only_a, only_b)
    assert comparison["mcnemar"]["p"] == pytest.approx(mcnemar_exact(only_a, only_b))
    assert comparison["difference"] == pytest.approx((only_a - only_b) / 4)
    assert f"[eval] {rows['teacher']['id']} vs {rows['tiny']['id']} on 4 shared pairs" in out

    # Resume: a wider run plays only the new seed; the stored episodes are kept as they were. (With an
    # sft TensorBoard log in the workdir now, its curves are plotted.)
    writer = MetricsWriter(tmp_path / "sft", progress=False)
    for step in (1, 2, 3):
        writer.write(step, {"loss": 3.0 / step})
    writer.close()
    before = {k: t.finished_at for k, t in episodes["teacher"].items()}
    config.eval.policies, config.eval.num_seeds = "teacher", 3
    run_stages(config, tmp_path)
    assert "this run played 2 task groups, 4 were stored already" in capsys.readouterr().out
    assert (out_dir / "training_curves.png").stat().st_size > 1000
    store_dir = out_dir / rows["teacher"]["id"] / "store"
    after = _episodes(store_dir, pairs | {(t, 4) for t in TASKS})
    assert len(after) == 6 and {k: after[k].finished_at for k in pairs} == before
    assert json.loads((out_dir / "eval_report.json").read_text())["policies"][0]["overall"]["episodes"] == 6
    # Other settings would mix two meanings of an episode in one store: refused.
    config.eval.max_steps = 5
    with pytest.raises(UserError, match=r"played with other settings \(max_steps: then \[3\], now \[5\]\)"):
        run_stages(config, tmp_path)
