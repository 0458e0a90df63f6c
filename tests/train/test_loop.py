"""The Trainer end to end: overfitting 8 examples, metrics and export, kill -9 and SIGTERM then resume, the NaN stop.

The overfitting run (in-process, one device) is also the uninterrupted reference of the kill -9
test, which runs the same configuration through the absl entry point (`train_smoke` stage: the
same Trainer on the same deterministic synthetic batches) in subprocesses. The FSDP-sharded
paths (sharded restore into a Trainer, sharded steps) are covered on the 8 test devices by the
last-good-checkpoint check below and by tests/train/test_step.py.
"""
import json
import math
import os
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from rmsweb_jax.models.qwen3_vl import from_hf
from rmsweb_jax.train import NonFiniteError, SyntheticBatches, Trainer, random_examples
from rmsweb_jax.train.metrics import read_metrics

from configs.common import base_config

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STEPS, EVERY = 60, 10
OVERRIDES = {"batch_size": 8, "optimizer.lr": 1e-2, "optimizer.warmup_steps": 5, "optimizer.total_steps": STEPS,
             "checkpoint.every_steps": EVERY, "checkpoint.keep": 3, "metrics.every_steps": 1}


def _config(init, **train):
    c = base_config()
    c.model.init = f"hf:{init}"
    c.mesh.shape = (1, 1, 1)
    for key, value in OVERRIDES.items():
        _set(c.train, key, value)
    for key, value in train.items():
        _set(c.train, key, value)
    return c


def _set(node, key, value):
    *path, last = key.split(".")
    for p in path:
        node = node[p]
    node[last] = value


def _flat(params) -> np.ndarray:
    return np.concatenate([np.asarray(x, np.float32).ravel() for x in jax.tree.leaves(params)])


@pytest.fixture(scope="module")
def overfit(tmp_path_factory, tiny_checkpoint):
    workdir = tmp_path_factory.mktemp("overfit")
    trainer = Trainer(_config(tiny_checkpoint), workdir, name="sft")
    source = SyntheticBatches(random_examples(trainer.model_config, count=8, seq_len=32, seed=0), batch_size=8)
    result = trainer.fit(source)
    return workdir, result, _flat(trainer.state.params)


def test_tiny_model_overfits_eight_examples(overfit):
    workdir, result, _ = overfit
    metrics = read_metrics(result.run_dir / "metrics.jsonl")
    assert sorted(metrics) == list(range(1, STEPS + 1))
    first, last = metrics[1]["loss"], metrics[STEPS]["loss"]
    assert first > 5.0 and last < 0.05 and last < first / 100, (first, last)
    assert result.step == STEPS and result.resumed_from is None
    for key in ("tokens_per_s", "mfu", "learning_rate", "grad_norm", "param_norm"):
        assert math.isfinite(metrics[STEPS][key]) and metrics[STEPS][key] > 0, (key, metrics[STEPS])
    assert any(p.name.startswith("events.out.tfevents") for p in (result.run_dir / "tensorboard").iterdir())


def test_export_is_the_trained_model(overfit):
    workdir, result, trained = overfit
    assert (result.hf_dir / "tokenizer.json").is_file() and (result.hf_dir / "config.json").is_file()
    from flax import nnx
    exported = from_hf(result.hf_dir)
    np.testing.assert_array_equal(_flat(nnx.to_pure_dict(nnx.state(exported, nnx.Param))), trained)


def test_finished_run_restarts_as_a_no_op(overfit, tiny_checkpoint):
    workdir, result, trained = overfit
    trainer = Trainer(_config(tiny_checkpoint), workdir, name="sft")
    assert trainer.resumed_from == STEPS
    source = SyntheticBatches(random_examples(trainer.model_config, count=8, seq_len=32, seed=0), batch_size=8)
    again = trainer.fit(source)
    assert again.step == STEPS
    np.testing.assert_array_equal(_flat(trainer.state.params), trained)


def test_divergence_stops_naming_the_step_and_keeps_the_last_good_checkpoint(overfit, tiny_checkpoint):
    workdir, result, trained = overfit
    # Continue the finished run for 10 more steps with an infinite learning rate: step 61's update
    # makes the parameters non-finite; the run must stop there without saving them.
    config = _config(tiny_checkpoint, **{"optimizer.total_steps": STEPS + 10, "optimizer.lr": float("inf"),
                        "checkpoint.every_steps": 1})
    trainer = Trainer(config, workdir, name="sft")
    assert trainer.resumed_from == STEPS
    source = SyntheticBatches(random_examples(trainer.model_config, count=8, seq_len=32, seed=0), batch_size=8)
    with pytest.raises(NonFiniteError, match=rf"training stopped at step {STEPS + 1}: non-finite values .*"
                                             rf"last good checkpoint is step {STEPS} in ") as info:
        trainer.fit(source)
    assert info.value.step == STEPS + 1
    checkpoints = trainer.checkpoints
    assert checkpoints.latest_step() == STEPS
    sharded = _config(tiny_checkpoint)
    sharded.mesh.shape = (1, -1, 1)  # restore it FSDP-sharded over the 8 devices
    restored = Trainer(sharded, workdir, name="sft")
    assert restored.resumed_from == STEPS
    q = restored.state.params["text"]["q_kernel"]
    assert q.addressable_shards[0].data.size < q.size
    np.testing.assert_array_equal(_flat(restored.state.params), trained)
    restored.close()


def test_batch_that_does_not_divide_over_the_mesh_is_named(tmp_path, tiny_checkpoint):
    c = _config(tiny_checkpoint, batch_size=6)
    c.mesh.shape = (2, 2, 2)
    with pytest.raises(ValueError, match=r"config.train.batch_size = 6 with 1 microbatch\(es\) gives 6 rows per "
                                         r"microbatch, which do not divide over the mesh's data x fsdp = 4 devices "
                                         r"\(mesh shape \{'data': 2, 'fsdp': 2, 'tensor': 2\}\)"):
        Trainer(c, tmp_path)
    c = _config(tiny_checkpoint, batch_size=8, microbatches=3)
    with pytest.raises(ValueError, match=r"config.train.batch_size = 8 is not divisible by "
                                         r"config.train.microbatches = 3"):
        Trainer(c, tmp_path)
    with pytest.raises(ValueError, match=r"config.train.optimizer.warmup_steps: expected an integer in \[0, "
                                         r"total_steps=60\], got 100"):
        Trainer(_config(tiny_checkpoint, **{"optimizer.warmup_steps": 100}), tmp_path)


def _command(workdir, init):
    flags = [f"--config.train.{key}={value}" for key, value in OVERRIDES.items()]
    # The defaults alone, as _config() builds the in-process reference (the demo config tunes its own).
    return [sys.executable, "-m", "rmsweb_jax.main", "--config=configs/common.py", f"--workdir={workdir}",
            "--config.stages=train_smoke", f"--config.model.init=hf:{init}", "--config.mesh.shape=(1,1,1)",
            "--config.train_smoke.examples=8", "--config.train_smoke.seq_len=32", "--config.train_smoke.seed=0",
            *flags]


def _env(cache):
    # The test session's XLA flags (tests/conftest.py) and one-device mesh, so the program equals the
    # in-process reference's; a compilation cache lets the rerun skip the compile (same program).
    return dict(os.environ, JAX_COMPILATION_CACHE_DIR=str(cache))


def _finished_checkpoints(run_dir):
    directory = run_dir / "checkpoints"
    return sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit()) if directory.is_dir() else []


def _logged_steps(run_dir):
    path = run_dir / "metrics.jsonl"
    return len(path.read_text().splitlines()) if path.is_file() else 0


def _signalled_run(run_dir, init, cache, log_path, sig) -> tuple[int, float, str]:
    """Runs train_smoke in a subprocess and sends it `sig` 3 steps past its first checkpoint (off the checkpoint
    grid); returns its exit status, the seconds from the signal to its exit, and its log."""
    with open(log_path, "w") as log:
        victim = subprocess.Popen(_command(run_dir, init), cwd=REPO, env=_env(cache), stdout=log,
                                  stderr=subprocess.STDOUT)
        deadline, sent = time.time() + 600, None
        while time.time() < deadline and victim.poll() is None:
            done = _finished_checkpoints(run_dir / "train_smoke")
            if done and _logged_steps(run_dir / "train_smoke") >= done[-1] + 3:
                victim.send_signal(sig)
                sent = time.monotonic()
                break
            time.sleep(0.01)
        victim.wait(timeout=60)
    assert sent is not None, log_path.read_text()[-3000:]
    return victim.returncode, time.monotonic() - sent, log_path.read_text()


def _rerun_resumes_to_the_reference(run_dir, init, cache, reference, resumed_from: int, lines: int) -> None:
    """Reruns the same command: it resumes from `resumed_from`, writes `lines` metric lines in all, and every step's
    loss equals the uninterrupted run's."""
    rerun = subprocess.run(_command(run_dir, init), cwd=REPO, env=_env(cache), capture_output=True, text=True,
                           timeout=600)
    assert rerun.returncode == 0, rerun.stdout[-3000:] + rerun.stderr[-3000:]
    assert f"resumed from checkpoint step {resumed_from}" in rerun.stdout + rerun.stderr
    summary = json.loads((run_dir / "train_smoke" / "summary.json").read_text())
    assert summary["resumed_from"] == resumed_from and summary["steps"] == STEPS
    assert len((run_dir / "train_smoke" / "metrics.jsonl").read_text().splitlines()) == lines
    want = read_metrics(reference.run_dir / "metrics.jsonl")
    got = read_metrics(run_dir / "train_smoke" / "metrics.jsonl")
    assert sorted(got) == sorted(want) == list(range(1, STEPS + 1))
    for step in range(1, STEPS + 1):
        assert abs(got[step]["loss"] - want[step]["loss"]) <= 1e-6, (step, got[step]["loss"], want[step]["loss"])


@pytest.mark.slow
def test_kill_minus_9_then_rerun_resumes_with_the_uninterrupted_losses(overfit, tiny_checkpoint, tmp_path):
    _, reference, _ = overfit
    run_dir, cache = tmp_path / "killed", tmp_path / "jax_cache"
    status, _, log = _signalled_run(run_dir, tiny_checkpoint, cache, tmp_path / "killed.log", signal.SIGKILL)
    assert status == -signal.SIGKILL, (status, log[-3000:])
    killed_at = _logged_steps(run_dir / "train_smoke")
    saved = _finished_checkpoints(run_dir / "train_smoke")
    assert saved and saved[-1] < killed_at < STEPS, (saved, killed_at)
    assert not (run_dir / "train_smoke" / "summary.json").exists()
    # the steps after the checkpoint run twice
    _rerun_resumes_to_the_reference(run_dir, tiny_checkpoint, cache, reference, saved[-1],
                                    STEPS + killed_at - saved[-1])


@pytest.mark.slow
def test_sigterm_saves_the_step_it_reached_and_the_rerun_resumes_there(overfit, tiny_checkpoint, tmp_path):
    """A preempted VM's SIGTERM between checkpoints: the step in flight finishes and is saved, one line says so,
    status 143 within the 30 s a VM gets; the rerun resumes at that step, runs no step twice, and every loss equals
    the uninterrupted run's."""
    _, reference, _ = overfit
    run_dir, cache = tmp_path / "preempted", tmp_path / "jax_cache"
    status, took, log = _signalled_run(run_dir, tiny_checkpoint, cache, tmp_path / "preempted.log", signal.SIGTERM)
    assert status == 143 and took < 30 and "Traceback" not in log, (status, took, log[-3000:])
    ours = [line for line in log.splitlines() if line.startswith("rmsweb:")]
    assert len(ours) == 1, ours
    step = int(ours[0].split("preempted at step ")[1].split()[0])
    assert ours == [f"rmsweb: preempted at step {step} of train_smoke; checkpoint saved; rerun the same command to "
                    "resume"]
    assert _finished_checkpoints(run_dir / "train_smoke")[-1] == step == _logged_steps(run_dir / "train_smoke")
    assert step % EVERY and step < STEPS, step
    _rerun_resumes_to_the_reference(run_dir, tiny_checkpoint, cache, reference, step, STEPS)  # no step twice


def test_dtypes_and_remat_policy_come_from_the_config(tmp_path, tiny_checkpoint):
    c = _config(tiny_checkpoint)
    c.model.compute_dtype, c.model.remat_policy = "bfloat16", "full"
    trainer = Trainer(c, tmp_path, name="sft")
    model = trainer.model()
    assert (model.runtime.param_dtype, model.runtime.compute_dtype, model.runtime.remat_policy) == (
        "float32", "bfloat16", "full")
    assert {x.dtype for x in jax.tree.leaves((trainer.state.params, trainer.state.opt_state))} >= {np.dtype("float32")}
    assert all(x.dtype == np.float32 for x in jax.tree.leaves(trainer.state.params))
    trainer.close()
