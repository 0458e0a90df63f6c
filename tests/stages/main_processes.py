"""`python -m rmsweb_jax.main` as the processes of one run: JAX processes on 127.0.0.1 (gloo), each with its own CPU
devices, as the hosts of a pod slice run it (tests/stages/test_multiprocess_stages.py, test_pod_layouts.py)."""
from __future__ import annotations

import os
import pathlib
import socket
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(workdir: pathlib.Path, processes: int, devices: int, arguments: list[str]) -> list[tuple]:
    """Starts the `processes` processes of one run over `workdir` (`devices` CPU devices each, `arguments` after
    --workdir); returns (process, log path) of each; logs beside the workdir as <name>.process<i>.log."""
    port, started = _free_port(), []
    for index in range(processes):
        env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(REPO), RMSWEB_TRACEBACK="1",
                   XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}")
        if processes > 1:
            env.update(RMSWEB_DISTRIBUTED="1", JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}",
                       JAX_NUM_PROCESSES=str(processes), JAX_PROCESS_ID=str(index))
        else:
            env["RMSWEB_DISTRIBUTED"] = "0"
        log = workdir.parent / f"{workdir.name}.process{index}.log"
        command = [sys.executable, "-m", "rmsweb_jax.main", f"--workdir={workdir}", *arguments]
        with open(log, "w") as out:
            started.append((subprocess.Popen(command, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT,
                                             start_new_session=True), log))
    return started


def wait(runs: list[list[tuple]], timeout_s: float) -> list[str]:
    """Waits for every process of `runs` (on a hang, kills them all); fails with the logs' tails if one fails;
    returns every log's text in order."""
    failed = []
    for run in runs:
        for process, log in run:
            try:
                process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                for other, _ in (p for r in runs for p in r):
                    other.kill()
                process.wait()
            if process.returncode != 0:
                failed.append(f"{log} exited {process.returncode}:\n{log.read_text()[-3000:]}")
    assert not failed, "\n\n".join(failed)
    return [log.read_text() for run in runs for _, log in run]
