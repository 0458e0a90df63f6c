"""Preemption and a full disk in training, through `python -m rmsweb_jax.main` in real processes: SIGTERM to one of
two JAX processes (gloo on 127.0.0.1) makes both save the same step and stop; a checkpoint that no longer fits its
filesystem (a small tmpfs) stops the run with one line, status 2, and after the filesystem grows the same command
resumes from the last checkpoint that was written whole. (One process's SIGTERM: tests/train/test_loop.py.)"""
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from rmsweb_jax.train.metrics import read_metrics
from tests.small_filesystem import grow, small_tmpfs
from tests.stages import main_processes

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PREEMPTED = 143
STEPS = 60  # the SIGTERM comes after step 4; steps take ~0.1 s once compiled


def _train_smoke(init, **train) -> list[str]:
    flags = {"batch_size": 8, "optimizer.warmup_steps": 0, "metrics.every_steps": 1, **train}
    return ["--config=configs/common.py", "--config.stages=train_smoke", f"--config.model.init=hf:{init}",
            "--config.train_smoke.examples=8", "--config.train_smoke.seq_len=32",
            *[f"--config.train.{key}={value}" for key, value in flags.items()]]


def _checkpoints(run_dir) -> list[int]:
    folder = run_dir / "checkpoints"
    return sorted(int(p.name) for p in folder.iterdir() if p.name.isdigit()) if folder.is_dir() else []


@pytest.mark.slow
def test_sigterm_to_one_of_two_processes_saves_the_same_step_on_both(tmp_path, tiny_checkpoint):
    workdir = tmp_path / "run"
    arguments = [*_train_smoke(tiny_checkpoint, **{"optimizer.total_steps": STEPS, "checkpoint.every_steps": STEPS}),
                 "--config.mesh.shape=(1,2,1)"]
    run = main_processes.start(workdir, 2, 1, arguments)
    metrics = workdir / "train_smoke" / "metrics.jsonl"
    deadline = time.monotonic() + 600
    while not (metrics.is_file() and len(metrics.read_text().splitlines()) >= 4):
        assert all(p.poll() is None for p, _ in run) and time.monotonic() < deadline, run[0][1].read_text()[-3000:]
        time.sleep(0.05)
    run[1][0].send_signal(signal.SIGTERM)  # process 1 only, as when one host of a slice is reclaimed first
    for process, _ in run:
        process.wait(timeout=120)
    logs = [log.read_text() for _, log in run]
    assert [p.returncode for p, _ in run] == [PREEMPTED, PREEMPTED], [log[-3000:] for log in logs]
    steps = {int(m) for log in logs for m in re.findall(r"^rmsweb: preempted at step (\d+) of train_smoke; "
                                                        r"checkpoint saved; rerun the same command to resume$", log,
                                                        re.M)}
    assert len(steps) == 1 and all(log.count("rmsweb:") == 1 and "Traceback" not in log for log in logs), logs
    step = steps.pop()
    assert _checkpoints(workdir / "train_smoke") == [step]
    assert sorted(read_metrics(metrics)) == list(range(1, step + 1))

    logs = main_processes.wait([main_processes.start(workdir, 2, 1, arguments)], 600)
    assert f"resumed from checkpoint step {step}" in logs[0], logs[0][-3000:]  # process 0 reports
    assert sorted(read_metrics(metrics)) == list(range(1, STEPS + 1))


@pytest.mark.slow
def test_a_full_disk_under_a_checkpoint_is_one_line_and_the_run_resumes_once_there_is_space(tmp_path,
                                                                                            tiny_checkpoint):
    # The tiny model's checkpoints take 2.4 MiB: the third of its every-2-steps saves does not fit in 5 MiB.
    with small_tmpfs(tmp_path / "small", "5m") as small:
        command = [sys.executable, "-m", "rmsweb_jax.main", f"--workdir={small / 'run'}",
                   *_train_smoke(tiny_checkpoint, **{"optimizer.total_steps": 6, "checkpoint.every_steps": 2}),
                   "--config.mesh.shape=(1,1,1)"]
        env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=1", JAX_PLATFORMS="cpu")
        full = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
        err = full.stdout + full.stderr
        assert full.returncode == 2 and "Traceback" not in err, err[-3000:]
        ours = [line for line in err.splitlines() if line.startswith("rmsweb:")]
        assert len(ours) == 2 and len(err.splitlines()) < 40, err[-3000:]
        warning = ours.pop(0)  # before the first stage: the plan's checkpoints and export do not fit
        assert re.fullmatch(rf"rmsweb: warning: workdir {small / 'run'} has [\d.]+ GiB free, and this run's "
                            r"checkpoints and exports may take [\d.]+ GiB \(train_smoke [\d.]+ GiB; "
                            r"config.train.checkpoint.keep = 3\): a full disk stops the run, and the same command "
                            r"resumes it once there is space", warning), warning
        assert re.fullmatch(rf"rmsweb: error: the disk under workdir {small / 'run'} is full \([\d.,]+ MiB free there "
                            r"now\): No space left on device writing (checkpoint \d+|a checkpoint) in .*/checkpoints "
                            r"\(a checkpoint here takes [\d.]+ MiB\); what was saved before is intact: free space and "
                            r"rerun the same command to resume", ours[0]), ours
        saved = _checkpoints(small / "run" / "train_smoke")
        assert saved and saved[-1] < 6, saved

        grow(small, "64m")
        rerun = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
        assert rerun.returncode == 0, (rerun.stdout + rerun.stderr)[-3000:]
        assert f"resumed from checkpoint step {saved[-1]}" in rerun.stdout + rerun.stderr
        assert sorted(read_metrics(small / "run" / "train_smoke" / "metrics.jsonl"))[-1] == 6
