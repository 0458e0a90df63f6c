"""The salvage stage end to end on a tiny random policy: a state set from a real store, group sampling,
the real gates and anchor, checkpoints with the sampler's state, kill -9 and exact resume, HF export.

A random policy never writes the reference action, so with contrast gates every group is rejected and
trains through the anchor (the policy rows' path is covered in test_batches / TRAIN's loss tests)."""
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import time

import pytest

from rmsweb_jax.collect.sft_view import SFTView
from rmsweb_jax.collect.store_fixture import write_synthetic_store
from rmsweb_jax.main import run_stages
from rmsweb_jax.mining.state_set import CriticalState, state_id, write_state_set
from rmsweb_jax.train.metrics import read_metrics

STEPS = 3
REPO = pathlib.Path(__file__).resolve().parents[2]


def _config():
    from configs.common import base_config
    c = base_config()
    c.stages = ("salvage",)
    c.mesh.shape = (1, 1, 1)
    c.data.buckets = (2560,)
    c.data.bucket_patches = (640,)
    # config.train as an SFT stage would have it; salvage.train gives Salvage-DS its own batch, length, rate
    c.train.batch_size = 1
    c.train.optimizer.lr = 1e-5
    c.train.optimizer.warmup_steps = 50
    c.train.optimizer.total_steps = 100
    c.salvage.train.batch_size = 4  # 1 group x 2 samples + room for 2 anchor rows
    c.salvage.train.lr = 3e-3
    c.salvage.train.warmup_steps = 1
    c.salvage.train.total_steps = STEPS
    c.train.checkpoint.every_steps = 1
    c.train.checkpoint.keep = 5
    c.train.checkpoint.async_save = False
    c.train.metrics.every_steps = 1
    c.salvage.init = "random:tiny"
    c.salvage.group_size = 2
    c.salvage.groups_per_step = 1
    c.salvage.max_draws_per_step = 2
    c.salvage.max_new_tokens = 6
    c.salvage.sample_batch = 4
    c.salvage.gates = "contrast"
    c.salvage.anchor = "all"
    c.salvage.loss.anchor_weight = 1.0
    return c


def write_states(tmp_path):
    store = write_synthetic_store(tmp_path / "store", tasks=2, seeds=1, viewport=(200, 120))
    view = SFTView(store)
    states = []
    for i in range(len(view)):
        ex = view[i]
        states.append(CriticalState(
            state_id=state_id("replay", ex.request_id, ex.step.step), task_id=ex.task_id, seed=ex.seed,
            attempt=ex.attempt, step=ex.step.step, request_id=ex.request_id, store_dir=str(store),
            reference_text=ex.target_text, reference_action=ex.step.action, failure_mode="wrong_element",
            critical=True, replay_accuracy=0.0, reference_logprob=None, source="replay", prefix_matched=None,
            teacher_label=None))
    write_state_set(tmp_path / "mine" / "states.arrayrecord", states)
    return len(states)


@pytest.mark.slow
def test_salvage_trains_through_the_anchor_and_resumes_exactly(tmp_path):
    n_states = write_states(tmp_path)
    run_stages(_config(), tmp_path)
    run_dir = tmp_path / "salvage"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == STEPS and summary["states"] == n_states
    assert (run_dir / "hf" / "config.json").is_file()
    metrics = read_metrics(run_dir / "metrics.jsonl")
    assert sorted(metrics) == [1, 2, 3]
    for m in metrics.values():
        # Nothing right: both states of the budget drawn, none accepted, both anchored.
        assert (m["groups_accepted"], m["states_drawn"], m["shortfall"], m["groups_anchored"]) == (0, 2, 1, 2)
        assert m["correct_share"] == 0.0 and m["reward_mean"] == -1.0
        assert m["rows_anchor_rows"] == 2 and m["rows_policy_rows"] == 0
        assert m["draw_s"] > 0 and m["batch_s"] > 0  # the update's parts timed (the step's step_s is all of it)
    assert "sync_s" not in metrics[1] and metrics[2]["sync_s"] > 0 and metrics[3]["sync_s"] > 0  # the last sync's
    assert summary["sampler_state"]["drawn"] == 2 * STEPS
    losses = {s: m["loss"] for s, m in metrics.items()}
    assert losses[3] < losses[1]  # the anchor NLL on the reference tool calls falls

    # kill -9 a second run in its second update (step 1 checkpointed, step 2's groups drawn), rerun it:
    # it resumes at step 1 and every loss and the sampler's draws equal the uninterrupted run's. The
    # victim waits there for the kill (see __main__), so however fast the machine, it cannot finish first.
    killed = tmp_path / "killed"
    (killed / "mine").mkdir(parents=True)
    shutil.copy(tmp_path / "mine" / "states.arrayrecord", killed / "mine")
    at_step_2 = tmp_path / "at_step_2"
    command = [sys.executable, "-m", "tests.salvage.test_salvage_stage", str(killed), str(at_step_2)]
    env = dict(os.environ, PYTHONPATH=str(REPO))
    with open(tmp_path / "killed.log", "w") as log:
        victim = subprocess.Popen(command, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.time() + 900
        while time.time() < deadline and victim.poll() is None and not at_step_2.exists():
            time.sleep(0.05)
        assert at_step_2.exists(), (victim.poll(), (tmp_path / "killed.log").read_text()[-3000:])
        victim.send_signal(signal.SIGKILL)
        victim.wait(timeout=60)
    assert victim.returncode == -signal.SIGKILL, (victim.returncode, (tmp_path / "killed.log").read_text()[-3000:])
    saved = _checkpoints(killed / "salvage")
    assert saved and saved[-1] < STEPS and not (killed / "salvage" / "summary.json").exists(), saved
    assert saved == [1] and sorted(read_metrics(killed / "salvage" / "metrics.jsonl")) == [1], saved
    run_stages(_config(), killed)
    again = json.loads((killed / "salvage" / "summary.json").read_text())
    assert again["resumed_from"] == saved[-1] and again["steps"] == STEPS
    assert again["sampler_state"] == summary["sampler_state"]
    redone = read_metrics(killed / "salvage" / "metrics.jsonl")
    assert sorted(redone) == sorted(metrics)
    for step, m in redone.items():
        assert abs(m["loss"] - losses[step]) <= 1e-6, (step, m["loss"], losses[step])
        assert m["states_drawn"] == metrics[step]["states_drawn"]


@pytest.mark.slow
def test_the_kl_to_the_sft_policy_runs_end_to_end(tmp_path):
    """kl_beta > 0: the frozen SFT policy (the run's init) is loaded beside the trained one, and its log-probs of
    every policy row enter the loss as k3. Gates off, so every drawn group is a policy group; the random policy's
    rewards are all -1, so its advantages are 0 and only weight decay moves the weights. The first update's policy
    is the reference (KL 0); the decayed policies of the later updates are not (KL > 0), and the whole loss is
    kl_beta x KL."""
    write_states(tmp_path)
    config = _config()
    config.salvage.gates = "none"
    config.salvage.loss.kl_beta = 0.5
    config.train.optimizer.weight_decay = 10.0  # x lr 3e-3: the weights shrink 3% an update
    config.salvage.train.warmup_steps = 0  # the first update at the full rate (a warm-up starts at 0)
    run_stages(config, tmp_path)
    metrics = read_metrics(tmp_path / "salvage" / "metrics.jsonl")
    assert sorted(metrics) == [1, 2, 3]
    for m in metrics.values():
        assert (m["groups_accepted"], m["rows_policy_rows"], m["rows_anchor_rows"]) == (1, 2, 0), m
        assert m["reward_mean"] == -1.0
        assert m["loss"] == pytest.approx(0.5 * m["kl"], rel=1e-4, abs=1e-9), m
    assert metrics[1]["kl"] == pytest.approx(0.0, abs=1e-7)
    assert metrics[2]["kl"] > 1e-5 and metrics[3]["kl"] > metrics[2]["kl"], {s: m["kl"] for s, m in metrics.items()}


@pytest.mark.slow
def test_several_optimizer_steps_per_draw_move_the_ratio_and_checkpoint_between_draws(tmp_path):
    """config.salvage.epochs = 2: each drawn batch takes two optimizer steps. The first runs on the policy the old
    log-probs came from (ratio 1); the second on the stepped one (weight decay moved it: the ratio leaves 1). The
    draw's counts are reported with the first step; a checkpoint due between the two waits for the second, so a
    resumed run starts at a draw. Gates off: every group is a policy group (rewards all -1, advantages 0)."""
    write_states(tmp_path)
    config = _config()
    config.salvage.gates = "none"
    config.salvage.epochs = 2
    config.salvage.train.total_steps = 4
    config.train.optimizer.weight_decay = 10.0  # x lr 3e-3: the weights shrink 3% a step
    config.salvage.train.warmup_steps = 0
    run_stages(config, tmp_path)
    metrics = read_metrics(tmp_path / "salvage" / "metrics.jsonl")
    assert sorted(metrics) == [1, 2, 3, 4]
    for step in (1, 3):  # a draw's first step: the old log-probs' own policy
        m = metrics[step]
        assert m["groups_accepted"] == 1 and m["rows_policy_rows"] == 2, m
        assert m["ratio_min"] == pytest.approx(1.0, abs=1e-5) and m["ratio_max"] == pytest.approx(1.0, abs=1e-5), m
    for step in (2, 4):  # the second step on the same rows: no draw reported, the ratio away from 1
        m = metrics[step]
        assert "groups_accepted" not in m and "draw_s" not in m, m
        assert max(m["ratio_max"] - 1.0, 1.0 - m["ratio_min"]) > 1e-4, m
    assert _checkpoints(tmp_path / "salvage") == [2, 4]  # every_steps = 1, but only at the end of a draw
    summary = json.loads((tmp_path / "salvage" / "summary.json").read_text())
    assert summary["steps"] == 4 and summary["this_run"]["states_drawn"] == 2, summary


def _checkpoints(run_dir):
    """Returns the finished checkpoint steps (Orbax renames a step's folder to its number when complete)."""
    directory = run_dir / "checkpoints"
    return sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit()) if directory.is_dir() else []


if __name__ == "__main__":  # the run that test_salvage_trains_through_the_anchor_and_resumes_exactly kills
    from rmsweb_jax.train.loop import Trainer
    take_step = Trainer.step

    def wait_for_the_kill_at_step_2(self, *args, **kwargs):
        if self.step_count == 1:  # step 1 is checkpointed and step 2's groups drawn: say so, wait to be killed
            self.checkpoints.wait()  # checkpoint 1's async save committed, however fast the sampling was
            pathlib.Path(sys.argv[2]).touch()
            time.sleep(3600)
            raise SystemExit("not killed within an hour")
        take_step(self, *args, **kwargs)

    Trainer.step = wait_for_the_kill_at_step_2
    run_stages(_config(), sys.argv[1])


@pytest.mark.slow
def test_grounding_rows_train_in_the_batchs_spare_rows(tmp_path):
    """salvage.grounding_rows: the ground stage's rows of the training split's pages (sft's split.json) fill the
    rows the policy and anchor rows leave, as anchor rows; a bad value or a zero anchor weight is refused first."""
    from rmsweb_jax.errors import UserError
    from rmsweb_jax.stages import salvage
    from rmsweb_jax.stages.sft_split import load_split, split_path, split_record
    write_states(tmp_path)
    config = _config()
    config.data.store_dir = str(tmp_path / "store")
    config.data.held_out_fraction = 0.0
    config.prompt.observation = "elements"  # grounding rows list the page's elements
    config.salvage.train.batch_size = 6  # 1 group x 2 samples + up to 2 state anchor rows + 2 spare
    config.salvage.train.total_steps = 2
    config.salvage.grounding_rows = 3
    data, view, split = load_split(config, tmp_path)  # the split the sft stage would write
    split_path(tmp_path).parent.mkdir(parents=True)
    split_path(tmp_path).write_text(json.dumps(split_record(data, view, split)))
    run_stages(config, tmp_path)
    logged = read_metrics(tmp_path / "salvage" / "metrics.jsonl").values()
    metrics = [m for m in logged if "rows_grounding_rows" in m]
    assert len(metrics) == 2
    for m in metrics:
        spare = 6 - m["rows_policy_rows"] - m["rows_anchor_rows"]
        assert m["rows_grounding_rows"] == min(3, spare) > 0, m
        assert m["rows_padding_rows"] == spare - m["rows_grounding_rows"]
    config.salvage.grounding_rows = -1
    with pytest.raises(UserError, match="config.salvage.grounding_rows = -1: expected an int >= 0"):
        salvage.check_config(config, tmp_path)
    config.salvage.grounding_rows = 2
    config.salvage.loss.anchor_weight = 0.0
    with pytest.raises(UserError, match="needs config.salvage.loss.anchor_weight > 0"):
        salvage.check_config(config, tmp_path)
    config.salvage.loss.anchor_weight = 0.1
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        config.salvage.grounding_weight = bad
        with pytest.raises(UserError, match="config.salvage.grounding_weight = .*: expected a number > 0"):
            salvage.check_config(config, tmp_path)
