"""Stages on a pod slice's shape: two real JAX processes on 127.0.0.1 with 4 CPU devices each (gloo) against
one process with 8 devices, both through `python -m rmsweb_jax.main` (RMSWEB_DISTRIBUTED=1 for the pair).

- salvage: the losses and the exported parameters of Salvage-DS updates equal the one-process run's
  (<= 1e-5): every process samples the same states on the global mesh, each feeds its rows of the batch,
  and the counted metrics are summed over processes (not one process's count x 2).
- eval: each process plays its share of the (task, seed) pairs in its own Chromium, process 0 merges the
  shares into the policy's store and writes the report once; the report's figures equal the one-process
  report's; a rerun on both hosts plays nothing again.
- mine (replay): every process replays the same reference steps on the global mesh (the sampler's
  outputs gathered where XLA spread them over both hosts; the reference log-probs' rows placed per
  process and gathered back), process 0 writes; the state set and report equal the one-process ones.
"""
import dataclasses
import json
import os
import re
import pathlib
import socket
import subprocess
import sys

import numpy as np
import pytest

from tests.stages import multiprocess_configs as configs
from tests.settings import collect_settings, store_writer

REPO = pathlib.Path(__file__).resolve().parents[2]
CONFIG = "tests/stages/multiprocess_configs.py"
DEVICES = 8
TIMEOUT_S = 900  # two processes and a reference compile at once on 2 cores


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(name: str, workdir: pathlib.Path, processes: int, overrides: list[str]) -> list[tuple]:
    """Starts the `processes` processes of one run of config `name`; returns (process, log path) of each."""
    port = _free_port()
    started = []
    for index in range(processes):
        env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(REPO), RMSWEB_TRACEBACK="1",
                   XLA_FLAGS=f"--xla_force_host_platform_device_count={DEVICES // processes}")
        if processes > 1:
            env.update(RMSWEB_DISTRIBUTED="1", JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}",
                       JAX_NUM_PROCESSES=str(processes), JAX_PROCESS_ID=str(index))
        else:
            env["RMSWEB_DISTRIBUTED"] = "0"
        log = workdir.parent / f"{workdir.name}.process{index}.log"
        command = [sys.executable, "-m", "rmsweb_jax.main", f"--config={CONFIG}:{name}", f"--workdir={workdir}",
                   *overrides]
        with open(log, "w") as out:
            started.append((subprocess.Popen(command, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT), log))
    return started


def _wait(runs: list[list[tuple]]) -> None:
    """Waits for every process of `runs`; fails with the logs' tails if one fails or hangs."""
    failed = []
    for run in runs:
        for process, log in run:
            try:
                process.wait(timeout=TIMEOUT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            if process.returncode != 0:
                failed.append(f"{log} exited {process.returncode}:\n{log.read_text()[-3000:]}")
    assert not failed, "\n\n".join(failed)


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory) -> pathlib.Path:
    """Returns the folder of the random tiny model, written once (every run loads the same weights)."""
    from configs.common import base_config
    from rmsweb_jax.model_init import load_model
    c = base_config()
    c.model.init, c.mesh.shape = "random:tiny", (1, 1, 1)
    return load_model(c, tmp_path_factory.mktemp("tiny"))[1]


@pytest.mark.slow
def test_salvage_step_on_two_processes_equals_one_process(tmp_path, tiny_checkpoint):
    from safetensors.numpy import load_file

    from rmsweb_jax.train.metrics import read_metrics
    from tests.salvage.test_salvage_stage import write_states
    one, two = tmp_path / "one", tmp_path / "two"
    n_states = write_states(one)
    (two / "mine").mkdir(parents=True)
    (two / "mine" / "states.arrayrecord").write_bytes((one / "mine" / "states.arrayrecord").read_bytes())
    overrides = [f"--config.salvage.init=hf:{tiny_checkpoint}"]
    _wait([_start("salvage", one, 1, overrides), _start("salvage", two, 2, overrides)])

    want, got = (read_metrics(w / "salvage" / "metrics.jsonl") for w in (one, two))
    assert sorted(want) == sorted(got) == list(range(1, configs.SALVAGE_STEPS + 1))
    for step in want:
        assert want[step]["rows_anchor_rows"] > 0 and want[step]["states_drawn"] > 0  # the step trained on rows
        for key in ("loss", "grad_norm", "param_norm", "anchor_loss"):
            assert abs(got[step][key] - want[step][key]) <= 1e-5, (step, key, got[step][key], want[step][key])
        # Counted over both processes' rows (process 0 holds every anchor row here, process 1 only padding).
        for key in ("target_tokens", "anchor_tokens", "states_drawn", "groups_anchored", "rows_anchor_rows"):
            assert got[step][key] == want[step][key], (step, key, got[step][key], want[step][key])
    a, b = (load_file(w / "salvage" / "hf" / "model.safetensors") for w in (one, two))
    assert sorted(a) == sorted(b)
    init = load_file(tiny_checkpoint / "model.safetensors")
    moved = max(float(np.abs(a[k] - init[k]).max()) for k in a)
    assert moved > 1e-3  # the updates changed the parameters
    worst = max(float(np.abs(a[k] - b[k]).max()) for k in a)
    assert worst <= 1e-5, worst
    summaries = [json.loads((w / "salvage" / "summary.json").read_text()) for w in (one, two)]
    assert summaries[0]["sampler_state"] == summaries[1]["sampler_state"] and summaries[1]["states"] == n_states


def _report(workdir: pathlib.Path) -> dict:
    """Returns workdir's eval_report.json with the workdir in its paths written as <workdir>, less the episodes'
    wall times (cost.wall_s: measured, never equal between two runs)."""
    def without_wall_time(node):
        if isinstance(node, dict):
            return {k: without_wall_time(v) for k, v in node.items() if k != "wall_s"}
        return [without_wall_time(v) for v in node] if isinstance(node, list) else node
    text = (workdir / "eval" / "eval_report.json").read_text().replace(str(workdir), "<workdir>")
    return without_wall_time(json.loads(text))


@pytest.mark.slow
def test_eval_on_two_processes_reports_what_one_process_reports(tmp_path):
    from rmsweb_jax.collect.store import TrajectoryStore
    one, two = tmp_path / "one", tmp_path / "two"
    _wait([_start("eval_teacher", one, 1, []), _start("eval_teacher", two, 2, [])])
    want, got = _report(one), _report(two)
    (policy,) = got["policies"]
    assert policy["overall"]["episodes"] == 9 and 0 < policy["overall"]["solved"] < 9  # mistakes made some fail
    assert got == want
    store = two / "eval" / policy["id"] / "store"
    with TrajectoryStore(store) as reader:
        trajectories = list(reader.trajectories())
    assert len(trajectories) == 9 and len({t.key for t in trajectories}) == 9  # each pair once, merged once
    assert sorted(p.name for p in store.parent.iterdir()) == ["settings.json", "store"]  # the parts are gone
    logs = [(two.parent / f"two.process{i}.log").read_text() for i in range(2)]
    played = [int(re.search(r"this run played (\d+) task groups", log).group(1)) for log in logs]
    assert played == [5, 4]  # pairs 0, 2, 4, 6, 8 and 1, 3, 5, 7: each host played its share

    # Rerun on both hosts: every pair is in the merged store already, so no host plays one again.
    _wait([_start("eval_teacher", two, 2, ["--config.rerun=eval"])])
    logs = [(two.parent / f"two.process{i}.log").read_text() for i in range(2)]
    assert all("this run played 0 task groups" in log for log in logs), logs[0][-2000:]
    assert _report(two) == want


def _redecode(store: pathlib.Path, checkpoint: pathlib.Path) -> tuple[int, list]:
    """Returns (steps, those whose stored turn differs from this process's greedy decoding of the same prompt).

    Each step's prompt is rebuilt exactly as the collector built it (its observation, the episode's earlier
    turns as collect/adapter.py shows them) and decoded by the checkpoint on a mesh over this process's 8
    devices: the one-process eval's layout."""
    from rmsweb_jax.agents.flax_policy import FlaxPolicy
    from rmsweb_jax.agents.policy import PastStep, PolicyOutput, StepContext
    from rmsweb_jax.agents.prompt import PromptBuilder, prompt_config_from
    from rmsweb_jax.collect.adapter import split_turn
    from rmsweb_jax.collect.store import TrajectoryStore
    from rmsweb_jax.sampling.chat_model import ChatModel
    from rmsweb_jax.sampling.sampler import SamplingParams
    config = configs.eval_model()
    chat_model = ChatModel.load(f"hf:{checkpoint}", store, config=config, max_batch=1)
    params = SamplingParams(max_new_tokens=config.eval.max_new_tokens, temperature=0.0)
    steps, differ = 0, []
    policy = FlaxPolicy(chat_model, PromptBuilder(prompt_config_from(config)), params, owns_model=True)
    with TrajectoryStore(store) as reader:
        for traj in reader.trajectories():
            past = []
            for step in reader.steps(traj):
                observation = step.observation()
                context = StepContext(task_id=traj.task_id, instruction=step.instruction, observation=observation,
                                      history=tuple(past), step=step.step)
                (out,) = policy.act([context])
                steps += 1
                if out.text != step.text:
                    differ.append((traj.key, step.step, step.text, out.text))
                thought, action_text = split_turn(PolicyOutput.from_text(step.text, observation))
                past.append(PastStep(screenshot=step.screenshot, url=step.url, thought=thought,
                                     action_text=action_text))
    policy.close()
    return steps, differ


@pytest.mark.slow
def test_eval_of_a_model_on_two_processes_samples_what_one_process_samples(tmp_path, tiny_checkpoint):
    from rmsweb_jax.sampling.chat_model import checkpoint_name
    # Each host samples on a mesh of its own 4 devices (its browsers ask for steps at their own pace), the
    # one-process run on all 8. The two runs' prompts differ (a prompt shows the page URL, with the port of each
    # process's own MiniWoB++ server), so their episodes may differ: what must hold is that every turn a host
    # stored is the 8-device greedy decoding of its prompt, and that the report counts every pair once.
    # flax:random:tiny: every process loads the random preset from the workdir at once (process 0 writes it).
    one, two = tmp_path / "one", tmp_path / "two"
    overrides = ["--config.eval.policies=tiny=flax:random:tiny"]
    _wait([_start("eval_model", one, 1, overrides), _start("eval_model", two, 2, overrides)])
    want, got = _report(one), _report(two)
    (policy,) = got["policies"]
    assert policy["overall"]["episodes"] == 6 and policy["id"] == want["policies"][0]["id"]
    logs = [(two.parent / f"two.process{i}.log").read_text() for i in range(2)]
    played = [int(re.search(r"this run played (\d+) task groups", log).group(1)) for log in logs]
    assert played == [3, 3]  # each host played its share with its own copy of the model
    assert ["wrote a random tiny checkpoint" in log for log in logs] == [True, False]
    # The same weights as the fixture's (the same preset and seed): the policy id holds their digest.
    assert policy["id"].split("@")[1] == checkpoint_name(tiny_checkpoint).split("@")[1]
    for workdir in (one, two):
        steps, differ = _redecode(workdir / "eval" / policy["id"] / "store", tiny_checkpoint)
        assert steps >= 6 and not differ, (workdir.name, steps, differ[:3])


@pytest.mark.slow
def test_mine_on_two_processes_writes_the_state_set_of_one_process(tmp_path, tiny_checkpoint):
    from rmsweb_jax.collect.store_fixture import write_synthetic_store
    from rmsweb_jax.mining.state_set import StateSet
    from rmsweb_jax.stages.sft import load_split, split_path, split_record
    store = write_synthetic_store(tmp_path / "store", tasks=3, seeds=2, viewport=(200, 120))
    overrides = [f"--config.mine.checkpoint=hf:{tiny_checkpoint}", f"--config.data.store_dir={store}"]
    one, two = tmp_path / "one", tmp_path / "two"
    config = configs.mine()
    config.data.store_dir = str(store)
    for workdir in (one, two):  # the split the sft stage would have written (mine reads it, never recomputes it)
        split_path(workdir).parent.mkdir(parents=True)
        split_path(workdir).write_text(json.dumps(split_record(*load_split(config, workdir))))
    _wait([_start("mine", one, 1, overrides), _start("mine", two, 2, overrides)])

    sets = []
    for workdir in (one, two):
        with StateSet(workdir / "mine" / "states.arrayrecord") as states:
            sets.append([states[i] for i in range(len(states))])
    assert len(sets[0]) > 0 and any(s.critical for s in sets[0])
    # The reference log-probs come from a forward pass whose rows lie on other devices (12 rows on 8 devices,
    # 2 x 8 padded rows on 2 x 4): equal to float32 rounding (measured ~1e-7 relative), the rest exactly.
    logprobs = [np.array([s.reference_logprob for s in states]) for states in sets]
    np.testing.assert_allclose(logprobs[1], logprobs[0], rtol=1e-6)
    assert [dataclasses.replace(s, reference_logprob=None) for s in sets[1]] == \
        [dataclasses.replace(s, reference_logprob=None) for s in sets[0]]
    reports = [json.loads((w / "mine" / "report.json").read_text().replace(str(w), "<workdir>")) for w in (one, two)]
    means = [report.pop("mean_reference_logprob")["critical"] for report in reports]
    assert abs(means[1] - means[0]) <= 1e-6 * abs(means[0])
    for report in reports:
        report.pop("throughput")  # measured
    assert reports[0] == reports[1]


@pytest.mark.slow
def test_mine_rollouts_on_two_processes_play_each_group_once_and_find_what_one_process_finds(tmp_path,
                                                                                             tiny_checkpoint):
    # Each host plays its share of the training groups with its own copy of the model (on its own 4 devices)
    # and process 0 merges the shares. The random tiny model writes no parseable turn, so every rollout leaves
    # its reference at the first step whatever its prompt held (the page URL's port differs between runs).
    from rmsweb_jax.agents.teacher import MistakeConfig, ScriptedTeacher
    from rmsweb_jax.collect.retries import RetryCollector
    from rmsweb_jax.collect.store import TrajectoryStore
    from rmsweb_jax.judges.programmatic import ProgrammaticJudge
    from rmsweb_jax.mining.state_set import StateSet
    from rmsweb_jax.stages.sft import load_split, split_path, split_record
    from rmsweb_jax.suites.miniwob import MiniWoBSuite, load_miniwob_tasks
    tasks = ("miniwob.click-test", "miniwob.click-button")
    known = {t.id: t for t in load_miniwob_tasks()}
    store = tmp_path / "store"
    teacher = ScriptedTeacher(MistakeConfig(), tasks=tasks)
    with MiniWoBSuite() as suite, store_writer(store, policy=teacher.name) as writer:
        RetryCollector(suite, teacher, ProgrammaticJudge(success="solved"), writer,
                       collect_settings(attempts=1, workers=1,
                       max_steps=6, progress=False)).run([known[t] for t in tasks], (0, 1))
    config = configs.mine_rollouts()
    config.data.store_dir = str(store)
    one, two = tmp_path / "one", tmp_path / "two"
    for workdir in (one, two):  # the split the sft stage would have written
        split_path(workdir).parent.mkdir(parents=True)
        split_path(workdir).write_text(json.dumps(split_record(*load_split(config, workdir))))
    overrides = [f"--config.mine.checkpoint=hf:{tiny_checkpoint}", f"--config.data.store_dir={store}"]
    _wait([_start("mine_rollouts", one, 1, overrides), _start("mine_rollouts", two, 2, overrides)])

    summaries = [json.loads((w / "mine" / "summary.json").read_text().replace(str(w), "<workdir>"))
                 for w in (one, two)]
    counts = [s["rollouts"] for s in summaries]
    assert counts[0]["rollouts"] == 3 and counts[0]["diverged"] == 3  # 3 training groups, 1 of 4 held out
    assert counts[1] == counts[0]
    rollouts = pathlib.Path(counts[1]["store"].replace("<workdir>", str(two)))
    with TrajectoryStore(rollouts) as reader:
        assert len({t.key for t in reader.trajectories()}) == 3 == len(list(reader.trajectories()))
    assert not rollouts.with_name(rollouts.name + ".parts").exists()  # merged, the parts removed
    logs = [(tmp_path / f"two.process{i}.log").read_text() for i in range(2)]
    played = [int(re.search(r"collect: (\d+) task groups to run, 0 already in the store \S+parts/process" + str(i),
                            log).group(1)) for i, log in enumerate(logs)]
    assert played == [2, 1]
    states = []
    for workdir in (one, two):
        with StateSet(workdir / "mine" / "states.arrayrecord") as found:
            states.append(sorted((s.task_id, s.seed, s.step, s.failure_mode) for s in
                                 (found[i] for i in range(len(found))) if s.source == "rollout"))
    assert len(states[0]) == 3 and states[1] == states[0]
