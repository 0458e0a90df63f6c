"""Every model stage at each pod preset's process layout, scaled down: real JAX processes on 127.0.0.1 (gloo)
run `python -m rmsweb_jax.main` through ground, sft, mine (replay and rollouts), salvage and eval,
and reach what one process with all the devices reaches.

A pod host has 4 chips; a preset's layout is what its mesh does to hosts (`scaled_layout`):
- tensor <= 4 (8B on v5p, (1, 16, 2)): a host holds whole tensor groups, each process feeds its own rows;
  scaled: 2 processes x 2 devices, mesh (1, 2, 2).
- tensor 8 over 4-chip hosts (32B, and 8B on v6e when it uses tensor 8): a tensor group spans two hosts, which
  then feed the same rows (train/feeds.py); scaled: 4 processes x 1 device, mesh (1, 2, 2).
- FSDP only: every device its own rows; scaled: 2 processes x 2 devices, mesh (1, 4, 1).
The reference is one process with 4 devices (mesh (1, 2, 2)): salvage's losses, the exported
weights, the state set and the eval report equal its own (to float32 rounding where rows sit on other devices).
Ground and sft read their examples through pipelines sharded by feed (each feed its slice of the shuffled
examples, data/sft.py), so their batches depend on the number of feeds: every layout here has two, and their
ground and sft losses equal one another's, whichever processes make up a feed.
"""
import json
import pathlib
import re

import numpy as np
import pytest

from rmsweb_jax.plan import chips
from tests.stages import main_processes, multiprocess_configs as configs
from tests.settings import collect_settings, store_writer

CONFIG = "tests/stages/multiprocess_configs.py:pod_pipeline"
PRESETS = ("qwen3_vl_8b_sft.py:v5p", "qwen3_vl_8b_sft.py:v6e", "qwen3_vl_32b_sft.py:v5p", "qwen3_vl_32b_sft.py:v6e")
TIMEOUT_S = 1500  # four processes and their compiles at once on 2 cores
TRAINED = ("ground", "sft", "salvage")
FEED_SHARDED = ("ground", "sft")  # examples sharded by feed: equal across layouts of as many feeds


def preset_mesh(preset: str) -> tuple[int, int, int]:
    """Returns the preset's (data, fsdp, tensor) over its slice's chips."""
    import importlib
    module, arg = preset.split(":")
    c = importlib.import_module(f"configs.{module[:-3]}").get_config(arg)
    n = chips.device_count(chips.chip(c.plan.chip), c.plan.topology)
    shape = list(c.mesh.shape)
    if -1 in shape:
        shape[shape.index(-1)] = n // -int(np.prod(shape))
    return tuple(shape)


def scaled_layout(mesh: tuple[int, int, int], host_chips: int = chips.HOST_CHIPS) -> tuple[int, int, tuple]:
    """Returns (processes, devices per process, mesh) of `mesh`'s host layout at tiny widths: two row blocks."""
    tensor = mesh[2]
    if tensor > host_chips:  # a tensor group spans tensor / host_chips hosts
        span = tensor // host_chips
        return 2 * span, 1, (1, 2, span)
    if tensor > 1:
        return 2, tensor, (1, 2, tensor)
    return 2, 2, (1, 4, 1)


def _layouts() -> list:
    by_layout: dict[tuple, list[str]] = {}
    for preset in PRESETS:
        by_layout.setdefault(scaled_layout(preset_mesh(preset)), []).append(preset)
    return [pytest.param(layout, id="+".join(p.replace("qwen3_vl_", "").replace("_sft.py", "") for p in presets))
            for layout, presets in by_layout.items()]


LAYOUTS = _layouts()


def _run(workdir: pathlib.Path, processes: int, devices: int, mesh: tuple, store: pathlib.Path) -> list[str]:
    """Runs the pipeline on `processes` processes of `devices` CPU devices each; returns their logs. Mine, salvage
    and eval start from the tiny checkpoint beside the store (not sft's export, whose batches depend on the feeds)."""
    checkpoint = f"hf:{store.parent / 'tiny'}"
    arguments = [f"--config={CONFIG}", f"--config.mesh.shape={mesh}", f"--config.data.store_dir={store}",
                 f"--config.eval.training_store={store}", f"--config.mine.checkpoint={checkpoint}",
                 f"--config.salvage.init={checkpoint}", f"--config.eval.policies=tiny=flax:{checkpoint}"]
    return main_processes.wait([main_processes.start(workdir, processes, devices, arguments)], TIMEOUT_S)


def _results(workdir: pathlib.Path) -> dict:
    """Returns what the run reached: every trained stage's per-step metrics, the state set, the eval report."""
    from rmsweb_jax.mining.state_set import StateSet
    from rmsweb_jax.train.metrics import read_metrics
    out = {"metrics": {s: read_metrics(workdir / s / "metrics.jsonl") for s in TRAINED}}
    with StateSet(workdir / "mine" / "states.arrayrecord") as states:
        out["states"] = [states[i] for i in range(len(states))]
    out["rollouts"] = json.loads((workdir / "mine" / "summary.json").read_text())["rollouts"]
    text = (workdir / "eval" / "eval_report.json").read_text().replace(str(workdir), "<workdir>")
    out["report"] = _without(json.loads(text), "wall_s")  # measured, never equal between two runs
    return out


def _without(node, key: str):
    if isinstance(node, dict):
        return {k: _without(v, key) for k, v in node.items() if k != key}
    return [_without(v, key) for v in node] if isinstance(node, list) else node


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> pathlib.Path:
    """Returns a store of the scripted teacher on click-test and click-button, seeds 0-3 (MiniWoB++ pages, so
    that mine's rollouts and eval play the same tasks)."""
    from rmsweb_jax.agents.teacher import MistakeConfig, ScriptedTeacher
    from rmsweb_jax.collect.retries import RetryCollector
    from rmsweb_jax.judges.programmatic import ProgrammaticJudge
    from rmsweb_jax.suites.miniwob import MiniWoBSuite, load_miniwob_tasks
    tasks = ("miniwob.click-test", "miniwob.click-button")
    known = {t.id: t for t in load_miniwob_tasks()}
    from configs.common import base_config
    from rmsweb_jax.model_init import load_model
    path = tmp_path_factory.mktemp("pod") / "store"
    c = base_config()
    c.model.init, c.mesh.shape = "random:tiny", (1, 1, 1)
    load_model(c, path.parent)[1].rename(path.parent / "tiny")  # the checkpoint every run's later stages load
    teacher = ScriptedTeacher(MistakeConfig(), tasks=tasks)
    with MiniWoBSuite() as suite, store_writer(path, policy=teacher.name) as writer:
        RetryCollector(suite, teacher, ProgrammaticJudge(success="solved"), writer,
                       collect_settings(attempts=1, workers=1, max_steps=6, progress=False)
                       ).run([known[t] for t in tasks], (0, 1, 2, 3))
    return path


@pytest.fixture(scope="module")
def reference(store) -> dict:
    """Returns the results of one process with 4 devices, mesh (1, 2, 2)."""
    workdir = store.parent / "one"
    _run(workdir, 1, 4, (1, 2, 2), store)
    return _results(workdir)


@pytest.fixture(scope="module")
def layout_run(store):
    """Returns run(layout) -> (logs, results) of the pipeline at `layout`, each layout run once per module."""
    done: dict[tuple, tuple[list[str], dict]] = {}

    def run(layout: tuple) -> tuple[list[str], dict]:
        if layout not in done:
            processes, devices, mesh = layout
            workdir = store.parent / f"pod{processes}x{devices}"
            done[layout] = _run(workdir, processes, devices, mesh, store), _results(workdir)
        return done[layout]
    return run


def test_each_preset_has_a_layout_here():
    # The presets' meshes map onto the layouts this file runs (a new layout would need its own run).
    layouts = {scaled_layout(preset_mesh(p)) for p in PRESETS}
    assert layouts <= {(2, 2, (1, 2, 2)), (4, 1, (1, 2, 2)), (2, 2, (1, 4, 1))}, layouts
    assert scaled_layout((1, 8, 8)) == (4, 1, (1, 2, 2)) and scaled_layout((1, 16, 2)) == (2, 2, (1, 2, 2))


def _same_steps(got: dict, want: dict, stage: str) -> None:
    assert sorted(got) == sorted(want) == list(range(1, configs.POD_STEPS + 1)), stage
    for step, metrics in want.items():
        assert abs(got[step]["loss"] - metrics["loss"]) <= 1e-5, (stage, step, got[step], metrics)
        assert got[step]["target_tokens"] == metrics["target_tokens"], (stage, step)  # counted once per feed


@pytest.mark.slow
@pytest.mark.timeout(2 * TIMEOUT_S)  # the first layout also builds the one-process reference
@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_pod_layout_runs_every_stage_to_the_results_of_one_process(layout, store, reference, layout_run):
    from safetensors.numpy import load_file
    processes, devices, _ = layout
    logs, got = layout_run(layout)
    for stage in TRAINED:
        if stage not in FEED_SHARDED:
            _same_steps(got["metrics"][stage], reference["metrics"][stage], stage)
    a, b = (load_file(w / "salvage" / "hf" / "model.safetensors")
            for w in (store.parent / "one", store.parent / f"pod{processes}x{devices}"))
    assert max(float(np.abs(a[k] - b[k]).max()) for k in a) <= 1e-5

    # Mine: the same state set (reference log-probs to float32 rounding), rollouts played once per group.
    want_states, got_states = reference["states"], got["states"]
    assert len(got_states) == len(want_states) > 0
    logprobs = [[np.nan if s.reference_logprob is None else s.reference_logprob for s in states]
                for states in (got_states, want_states)]  # rollout states have none
    np.testing.assert_allclose(*logprobs, rtol=1e-6)
    assert [(s.task_id, s.seed, s.step, s.source, s.critical) for s in got_states] == \
        [(s.task_id, s.seed, s.step, s.source, s.critical) for s in want_states]
    assert {k: v for k, v in got["rollouts"].items() if k != "store"} == \
        {k: v for k, v in reference["rollouts"].items() if k != "store"}

    # Eval: each host played its share with its own copy of each policy; the merged report is the reference's.
    assert got["report"]["policies"] == reference["report"]["policies"]
    played = [sum(int(n) for n in re.findall(r"this run played (\d+) task groups", log)) for log in logs]
    pairs = 2  # 2 tasks x 1 seed: pair i on process i % processes
    assert played == [len(got["report"]["policies"]) * len(range(p, pairs, processes)) for p in range(processes)]
    assert all("Traceback" not in log for log in logs)


@pytest.mark.slow
@pytest.mark.timeout(2 * TIMEOUT_S)
def test_layouts_of_as_many_feeds_ground_and_sft_alike(layout_run):
    """Ground's and sft's batches depend on the number of feeds only: every layout here has two."""
    first, *others = (layout_run(layout.values[0])[1] for layout in LAYOUTS)
    assert others, "one layout: nothing to compare"
    for got in others:
        for stage in FEED_SHARDED:
            _same_steps(got["metrics"][stage], first["metrics"][stage], stage)
