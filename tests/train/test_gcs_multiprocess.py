"""Two JAX processes (2 CPU devices each, gloo) train on one gs:// workdir of a GCS emulator: each writes its
shards of every Orbax checkpoint into the same bucket folder (tensorstore's GCS driver), process 0 the metrics;
the checkpoint on the bucket holds the parameters the processes ended with."""
import json
import os
import pathlib
import socket
import subprocess
import sys
import time
import uuid

import numpy as np
import pytest

from rmsweb_jax import storage
from rmsweb_jax.train.metrics import read_metrics
from tests.train import multiprocess_worker as worker

REPO = pathlib.Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_processes_checkpoint_into_one_bucket_folder(gcs_emulator, tmp_path, tiny_checkpoint):
    workdir = f"{gcs_emulator}/{uuid.uuid4().hex}/run"
    port, logs, procs = _free_port(), [], []
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=2",
               PYTHONPATH=str(REPO))
    for i in range(2):
        logs.append(open(tmp_path / f"process{i}.log", "w"))
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "tests.train.multiprocess_worker", "--init", str(tiny_checkpoint), "--workdir",
             workdir, "--out", str(tmp_path), "--processes", "2", "--process-id", str(i), "--port", str(port)],
            cwd=REPO, env=env, stdout=logs[-1], stderr=subprocess.STDOUT, start_new_session=True))
    try:
        deadline = time.time() + 600
        while time.time() < deadline and any(p.poll() is None for p in procs):
            if any(p.poll() not in (None, 0) for p in procs):
                break
            time.sleep(0.5)  # polling the processes' exit; the outcome is their exit codes
    finally:
        for p, log in zip(procs, logs):
            if p.poll() is None:
                p.kill()
            p.wait(timeout=60)
            log.close()
    text = "\n".join(f"--- process{i} ---\n" + (tmp_path / f"process{i}.log").read_text()[-3000:] for i in range(2))
    assert [p.returncode for p in procs] == [0, 0], text

    files = storage.remote_files(f"{workdir}/sft")
    step = str(worker.STEPS)
    # Both processes wrote their part of the final checkpoint into the one folder.
    for i in range(2):
        assert any(name.startswith(f"checkpoints/{step}/state/ocdbt.process_{i}/") for name in files), sorted(files)
    report = json.loads((tmp_path / "report0.json").read_text())
    logged = {str(s): m["loss"] for s, m in read_metrics(f"{workdir}/sft/metrics.jsonl").items()}
    assert logged == report["losses"] and len(logged) == worker.STEPS
    import orbax.checkpoint as ocp
    import jax
    path = storage.as_path(workdir) / "sft" / "checkpoints" / step / "state"
    with ocp.PyTreeCheckpointer() as ckpt:  # as host numpy arrays: this process has other devices
        metadata = ckpt.metadata(path).item_metadata.tree
        as_numpy = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), metadata)
        state = ckpt.restore(path, restore_args=as_numpy)
    restored = {"/".join(str(getattr(k, "key", k)) for k in path): np.asarray(v)
                for path, v in jax.tree_util.tree_flatten_with_path(state["params"])[0]}
    final = np.load(tmp_path / "params.npz")  # process 0's allgather of the parameters it ended with
    assert sorted(restored) == sorted(final.files)
    for k in final.files:
        np.testing.assert_array_equal(restored[k], final[k], err_msg=k)
