"""The command line as a user meets it, in real subprocesses: a mistake is one line naming the key, the value and
what would work (exit 2, no traceback), --help exits 0 on every entry point (and fast for the planner),
`--config.stages=help` describes the stages from their declarations, Ctrl-C stops a stage with one line (exit 130)."""
import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from rmsweb_jax.stages.pipeline import STAGES, stage_module

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(*args, timeout=300, env=None):
    return subprocess.run([sys.executable, "-m", *args], cwd=REPO, capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ, **(env or {})))


def _one_line(proc, prefix="rmsweb: error: ", *, logged=False) -> str:
    """Returns the error line of a command that failed as a user error: exit 2, one stderr line, no traceback
    (logged: a stage had started, so absl's INFO lines of its progress may come before it)."""
    lines = [line for line in proc.stderr.splitlines() if line.strip()
             and not (logged and re.match(r"[IW]\d{4} \d\d:\d\d:\d\d", line))]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith(prefix), (proc.returncode,
                                                                                      proc.stderr[-3000:])
    return lines[0]


W = "--workdir=WORKDIR"


@pytest.mark.parametrize("args, wants", [
    (["--config=configs/nope.py", W], ["--config=configs/nope.py: no such config file 'configs/nope.py'", "demo.py"]),
    (["--config=configs/demo.py", W, "--config.train.lr=abc"],
     ["--config.train.lr=abc: config.train has no field 'lr'", "config.train.optimizer.lr"]),
    (["--config=configs/demo.py", W, "--config.stage=model"],
     ["--config.stage=model: config has no field 'stage'; did you mean config.stages?"]),
    (["--config=configs/demo.py", W, "--config.train.optimizer.lr=abc"],
     ["--config.train.optimizer.lr=abc: expected a value of type float, as config.train.optimizer.lr = "]),
    (["--config=configs/demo.py", W, "--config.seed.x=1"], ["config.seed = 0 is a value, not a block"]),
    (["--config=configs/demo.py"], ["--workdir is missing"]),
], ids=["missing config file", "unknown key", "misspelt key", "wrong type", "below a value", "no workdir"])
def test_a_command_line_mistake_is_one_line_naming_key_value_and_what_works(tmp_path, args, wants):
    line = _one_line(_run("rmsweb_jax.main", *(a.replace("WORKDIR", str(tmp_path / "run")) for a in args)))
    for want in wants:
        assert want in line, line
    assert "\\n" not in line and "\"'" not in line  # no escaped text, no repr of a repr
    assert not (tmp_path / "run").exists()


def test_a_gpu_memory_share_out_of_range_is_one_line_before_the_run_starts(tmp_path):
    line = _one_line(_run("rmsweb_jax.main", "--config=configs/demo.py", f"--workdir={tmp_path / 'run'}",
                          env={"XLA_PYTHON_CLIENT_MEM_FRACTION": "1.5"}))
    assert "XLA_PYTHON_CLIENT_MEM_FRACTION='1.5': expected a fraction in (0, 1]" in line
    assert not (tmp_path / "run").exists()


def test_a_config_value_refused_by_its_settings_class_is_one_line(tmp_path):
    line = _one_line(_run("rmsweb_jax.main", "--config=configs/demo.py", f"--workdir={tmp_path}",
                          "--config.stages=salvage", "--config.salvage.loss.clip_low=1.5"), logged=True)
    assert "config.salvage.loss.clip_low = 1.5: expected < 1" in line


def test_the_viewer_names_a_missing_store_in_one_line(tmp_path):
    line = _one_line(_run("rmsweb_jax.evaluate.viewer", "--store=/nonexistent", f"--out={tmp_path}/v"),
                     prefix="viewer: error: ")
    assert "no trajectory store at /nonexistent (missing store.json)" in line
    assert "--out" in _one_line(_run("rmsweb_jax.evaluate.viewer", "--store=/nonexistent"), prefix="viewer: error: ")


@pytest.mark.parametrize("module", ["rmsweb_jax.main", "rmsweb_jax.plan", "rmsweb_jax.evaluate.viewer",
                                    "rmsweb_jax.collect.store", "rmsweb_jax.collect.store_check",
                                    "rmsweb_jax.stages.table_spread", "rmsweb_jax.suites.download",
                                    "rmsweb_jax.sampling.serve"])
def test_help_exits_0(module):
    started = time.monotonic()
    proc = _run(module, "--help", timeout=120)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, (proc.returncode, proc.stderr[-2000:])
    assert len(proc.stdout + proc.stderr) > 100
    if module == "rmsweb_jax.plan":  # it imported JAX before parsing (8-13 s); help needs none of it
        assert time.monotonic() - started < 5.0
        assert "--chip" in proc.stdout + proc.stderr


def test_the_servers_flags_load_without_jax():
    # serve --help took 6-7 s importing JAX and the model before parsing; the flags and the request checks need
    # neither (ChatServer imports them when it is made)
    proc = subprocess.run([sys.executable, "-c", "import sys, rmsweb_jax.sampling.serve; "
                           "print(sorted(m for m in ('jax', 'flax', 'transformers') if m in sys.modules))"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "[]", (proc.stdout, proc.stderr[-2000:])


def test_stages_help_describes_every_stage_from_its_declarations():
    proc = _run("rmsweb_jax.main", "--config=configs/demo.py", "--config.stages=help")  # no --workdir needed
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = proc.stdout
    for name in STAGES:
        module = stage_module(name)
        block = text.split(f"\n{name}: ", 1)[1].split("\n\n", 1)[0]
        flat = " ".join(block.split())
        for path in module.OUTPUTS:
            assert f"<workdir>/{path}" in flat, (name, path, block)
        for stage in module.INPUT_STAGES:
            assert f"inputs: {stage}" in flat or f", {stage}" in flat, (name, stage, block)
        for read in module.CONFIG_READS:
            assert f"config.{read}" in flat, (name, read, block)
    assert "  config.train.optimizer.lr = 0.003" in text  # the demo's value of a field a stage reads


LATE_BACKGROUND_WORK = """
import os, signal, threading, time
from concurrent.futures import ThreadPoolExecutor
from rmsweb_jax.main import Stop

pool = ThreadPoolExecutor(1)
def finish_save():  # as Orbax's async checkpoint thread: it hands its last step to an executor after the Ctrl-C
    time.sleep(1.0)
    pool.submit(print, "saved", flush=True).result()
stop = Stop(None)
try:
    with stop.handling(None):
        threading.Thread(target=finish_save, name="finish-save").start()
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(30)
except KeyboardInterrupt:
    stop.exit()
"""


def test_ctrl_c_lets_background_work_finish_before_python_shuts_its_executors():
    """A Ctrl-C exit waits (within the grace) for threads still working, such as Orbax's async save: exiting first,
    Python shuts its executors down and the thread's next submit fails with a traceback ("cannot schedule new
    futures after interpreter shutdown"; seen once in a full run, after Ctrl-C in train_smoke)."""
    proc = subprocess.run([sys.executable, "-c", LATE_BACKGROUND_WORK], cwd=REPO, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 130, proc.stderr[-3000:]
    assert proc.stdout.split() == ["saved"] and "Traceback" not in proc.stderr, (proc.stdout, proc.stderr[-3000:])


def test_ctrl_c_during_a_stage_is_one_line_and_exit_130(tmp_path):
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=1")
    proc = subprocess.Popen(
        [sys.executable, "-m", "rmsweb_jax.main", "--config=configs/demo.py", f"--workdir={tmp_path}",
         "--config.stages=train_smoke", "--config.train.optimizer.total_steps=100000"],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    stages = tmp_path / "stages.json"
    deadline = time.monotonic() + 240
    while not (stages.is_file() and "train_smoke" in stages.read_text()):  # the stage has started
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-3000:]
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    ours = [line for line in err.splitlines() if line.startswith("rmsweb:")]
    assert proc.returncode == 130 and "Traceback" not in err, err[-3000:]
    assert ours == ["rmsweb: interrupted: stage train_smoke stopped by Ctrl-C; rerun the same command to resume"], err
    assert json.loads(stages.read_text())[-1]["seconds"] == 0.0  # it did not complete
