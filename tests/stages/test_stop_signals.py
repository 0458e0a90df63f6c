"""Ctrl-C and SIGTERM in stages that are not training loops, through `python -m rmsweb_jax.main`: the model stage
(which once ended a Ctrl-C in a segmentation fault) at two points; collect and eval, whose rerun after a SIGTERM
(or, for collect, after a full disk under a store flush) does only the task groups that were not finished. Each
ends with its one line and its status (130 after Ctrl-C, 143 after SIGTERM, 2 for a full disk), never a traceback
or a crash. (Training: tests/train/test_loop.py, tests/train/test_preemption.py.)"""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from rmsweb_jax.collect.store import TRAJECTORIES, TrajectoryStore, shard_name
from rmsweb_jax.web.browser import kill_marked, marked_pids
from tests.small_filesystem import grow, small_tmpfs

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ENV = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=1", JAX_PLATFORMS="cpu")
STATUS = {signal.SIGINT: 130, signal.SIGTERM: 143}


def _line(sig: int, stage: str) -> str:
    if sig == signal.SIGINT:
        return f"rmsweb: interrupted: stage {stage} stopped by Ctrl-C; rerun the same command to resume"
    return (f"rmsweb: preempted: stage {stage} stopped by SIGTERM; what it completed is saved; rerun the same "
            "command to resume")


def _started(workdir, stage: str, proc, timeout: float = 240) -> None:
    stages = workdir / "stages.json"
    deadline = time.monotonic() + timeout
    while not (stages.is_file() and f'"{stage}"' in stages.read_text()):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-3000:]
        time.sleep(0.05)


@pytest.mark.slow
@pytest.mark.parametrize("delay_s", (0.0, 2.0), ids=("at-start", "2s-in"))
@pytest.mark.parametrize("sig", (signal.SIGINT, signal.SIGTERM), ids=("ctrl-c", "sigterm"))
def test_the_model_stage_stops_with_its_line_and_status(tmp_path, sig, delay_s):
    proc = subprocess.Popen([sys.executable, "-m", "rmsweb_jax.main", "--config=configs/demo.py",
                             f"--workdir={tmp_path}", "--config.stages=model"], cwd=REPO, env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _started(tmp_path, "model", proc)
    time.sleep(delay_s)
    assert not (tmp_path / "model_smoke.json").exists(), "the stage finished before the signal"
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == STATUS[sig] and "Traceback" not in err, (proc.returncode, err[-3000:])
    assert [line for line in err.splitlines() if line.startswith("rmsweb:")] == [_line(sig, "model")], err[-3000:]


LOST_SIGNAL = """
import gc, json, os, pathlib, signal, sys, time
import ml_collections
from rmsweb_jax import main, preemption
from rmsweb_jax.stages.pipeline import STAGES_FILE, run_pipeline
workdir = pathlib.Path(sys.argv[2])
(workdir / STAGES_FILE).write_text(json.dumps([{"stage": "model", "ran": True, "seconds": 0.0}]))
sig = getattr(signal, sys.argv[1])
stop = main.Stop(str(workdir))
with stop.handling(None):
    def in_gc(phase, info):  # the signal lands in a garbage-collection callback, which drops what its handler raises
        if phase == "start" and not sent:
            sent.append(1)
            os.kill(os.getpid(), sig)
            time.sleep(0.2)
    sent = []
    gc.callbacks.append(in_gc)
    gc.collect()
    gc.callbacks.remove(in_gc)
    print("went on", flush=True)
    if sig == signal.SIGTERM:
        config = ml_collections.ConfigDict({"stages": ("model",), "rerun": ()})
        try:
            run_pipeline(config, workdir / "next")
        except preemption.Preempted:
            print("no stage started", (workdir / "next" / STAGES_FILE).exists(), flush=True)
    try:
        stop.raise_if_signalled()
    except (KeyboardInterrupt, preemption.Preempted) as err:
        print("raised", type(err).__name__, err, flush=True)
    os._exit(0)  # before the watchdog (STOP_GRACE_S, preemption.GRACE_S) ends the process
"""


@pytest.mark.parametrize("sig", (signal.SIGINT, signal.SIGTERM), ids=("ctrl-c", "sigterm"))
def test_a_signal_whose_exception_was_lost_still_stops_the_run(tmp_path, sig):
    """Python drops an exception raised in a garbage-collection callback (JAX registers one), so a signal's
    KeyboardInterrupt or Preempted can vanish and the stage goes on: the pipeline starts no further stage after a
    SIGTERM, and the end of the run raises the first signal's exception again."""
    proc = subprocess.run([sys.executable, "-c", LOST_SIGNAL, sig.name, str(tmp_path)], cwd=REPO, env=ENV,
                          capture_output=True, text=True, timeout=120)
    assert "Exception ignored" in proc.stderr and proc.stdout.startswith("went on"), proc.stderr[-3000:]
    raised = proc.stdout.splitlines()[-1]
    if sig == signal.SIGTERM:
        assert "no stage started False" in proc.stdout, proc.stdout
        assert raised == "raised Preempted " + _line(sig, "model")[len("rmsweb: "):], proc.stdout
    else:
        assert raised == "raised KeyboardInterrupt ", proc.stdout


def _sigterm_after_a_flush(command: list[str], flushed, stage: str) -> str:
    """Runs `command`, sends SIGTERM once `flushed()` (a store flush committed: some task groups done, most not);
    returns the run's stderr, having checked its status and its one line."""
    proc = subprocess.Popen(command, cwd=REPO, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 240
    while not flushed():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-3000:]
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143 and "Traceback" not in err, (proc.returncode, err[-3000:])
    assert [line for line in err.splitlines() if line.startswith("rmsweb:")] == [_line(signal.SIGTERM, stage)]
    return err


TASKS = "click-button,click-link,click-tab,enter-text"
SEEDS = 8  # 32 task groups: the run is far from done at its first flush, when the signal comes


def _collect(workdir) -> list[str]:
    return [sys.executable, "-m", "rmsweb_jax.main", "--config=configs/demo.py", f"--workdir={workdir}",
            "--config.stages=collect", f"--config.collect.tasks={TASKS}", f"--config.collect.num_seeds={SEEDS}",
            "--config.collect.attempts=2", "--config.collect.flush_every_tasks=1", "--config.collect.progress=False"]


@pytest.mark.slow
@pytest.mark.browser
def test_sigterm_in_collect_keeps_the_finished_groups_and_the_rerun_does_the_rest(tmp_path):
    store_dir = tmp_path / "store"
    err = _sigterm_after_a_flush(_collect(tmp_path), (store_dir / shard_name(TRAJECTORIES, 1)).exists, "collect")
    marker = err.split("browser pool marker ")[1].split()[0]
    time.sleep(1.0)
    left = marked_pids(marker)
    kill_marked(marker)
    assert not left, f"the stopped run left its browsers: {left}"

    done = TrajectoryStore(store_dir).finished_task_keys()
    total = 4 * SEEDS
    assert 1 <= len(done) < total, len(done)
    rerun = subprocess.run(_collect(tmp_path), cwd=REPO, env=ENV, capture_output=True, text=True, timeout=400)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    report = json.loads((tmp_path / "collect_report.json").read_text())
    assert (report["run"]["skipped"], report["run"]["collected"]) == (len(done), total - len(done))
    assert report["tasks"] == total


def _eval(workdir) -> list[str]:
    return [sys.executable, "-m", "rmsweb_jax.main", "--config=tests/stages/multiprocess_configs.py:eval_teacher",
            f"--workdir={workdir}", f"--config.collect.tasks={TASKS}", f"--config.eval.num_seeds={SEEDS}",
            "--config.collect.flush_every_tasks=1"]


@pytest.mark.slow
@pytest.mark.browser
def test_sigterm_in_eval_keeps_the_played_groups_and_the_rerun_plays_the_rest(tmp_path):
    _sigterm_after_a_flush(_eval(tmp_path), lambda: any(tmp_path.glob(f"eval/*/store/{shard_name(TRAJECTORIES, 1)}")),
                           "eval")
    store = next(tmp_path.glob("eval/*/store"))
    done = len(TrajectoryStore(store).finished_task_keys())
    assert 1 <= done < 4 * SEEDS, done

    rerun = subprocess.run(_eval(tmp_path), cwd=REPO, env=ENV, capture_output=True, text=True, timeout=400)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert f"this run played {4 * SEEDS - done} task groups, {done} were stored already" in rerun.stdout + \
        rerun.stderr


@pytest.mark.slow
@pytest.mark.browser
def test_a_full_disk_under_a_store_flush_is_one_line_and_the_rerun_collects_the_rest(tmp_path):
    with small_tmpfs(tmp_path / "small", "400k") as small:  # a flush or two of the demo's records fit
        workdir = small / "run"
        full = subprocess.run(_collect(workdir), cwd=REPO, env=ENV, capture_output=True, text=True, timeout=400)
        assert full.returncode == 2 and "Traceback" not in full.stderr, full.stderr[-3000:]
        ours = [line for line in full.stderr.splitlines() if line.startswith("rmsweb:")]
        assert len(ours) == 1 and ours[0].startswith(f"rmsweb: error: the disk under workdir {workdir} is full"), ours
        assert "No space left on device" in ours[0] and ours[0].endswith("rerun the same command to resume"), ours
        done = TrajectoryStore(workdir / "store").finished_task_keys()  # opens: the committed flushes read back
        assert len(done) < 4 * SEEDS

        grow(small, "64m")
        rerun = subprocess.run(_collect(workdir), cwd=REPO, env=ENV, capture_output=True, text=True, timeout=400)
        assert rerun.returncode == 0, rerun.stderr[-3000:]
        report = json.loads((workdir / "collect_report.json").read_text())
        assert (report["run"]["skipped"], report["run"]["collected"]) == (len(done), 4 * SEEDS - len(done))
        assert not list((workdir / "store").glob(".tmp-*")), "the half-written shard is still there"
