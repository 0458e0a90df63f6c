"""Image batches across JAX processes: two real processes train like one process on the same global batch.

The two processes hold different numbers and sizes of images (one has a row with two images of
different sizes and rows without, the other one image; in the last step it has no pixel_values at
all). The host-only tests check the global vision inputs against the single-process ones of the
same global batch, without a distributed runtime.
"""
import json
import os
import pathlib
import socket
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from rmsweb_jax.models import sharding
from rmsweb_jax.models.qwen3_vl import Qwen3VLConfig, tiny
from rmsweb_jax.train import batch as batch_lib
from rmsweb_jax.train import global_images, image_batch
from tests.train import multiprocess_worker as worker

REPO = pathlib.Path(__file__).resolve().parents[2]
CFG = tiny()
M = worker.MICROBATCHES


def _parts(step: int) -> list[global_images.ProcessImages]:
    """Returns each process's part of step `step`, as gather_parts would deliver it (no runtime needed)."""
    parts = []
    for host in worker.process_batches(CFG, step):
        b = batch_lib.validate_batch(host)
        images = image_batch.row_images(b, CFG, b["input_ids"], b["segment_ids"])
        given = b["pixel_values"].shape[0] if "pixel_values" in b else 0
        parts.append(global_images.local_part(images, len(b["input_ids"]), given, CFG.vision.patch_dim))
    return parts


@pytest.mark.parametrize("step", range(worker.STEPS))
def test_global_vision_equals_the_single_process_vision_of_the_global_batch(step):
    parts = _parts(step)
    rows = len(parts[0].per_row) // M  # per process and microbatch
    process_major = np.array([(p, k) for p in range(2) for k in range(rows)])
    got = global_images.global_vision(CFG, parts, process_major, M)
    want = batch_lib.prepare_batch(worker.global_batch(CFG, worker.process_batches(CFG, step)), CFG, M).inputs.vision
    assert got.pixel_values.shape == want.pixel_values.shape == (M, 128, CFG.vision.patch_dim)
    for name, a, b in zip(want._fields, got, want):
        np.testing.assert_array_equal(a, b, err_msg=name)
    # Rows alternating between processes: the images follow the rows' global order, not the processes'.
    alternating = np.array([(p, k) for k in range(rows) for p in range(2)])
    got = global_images.global_vision(CFG, parts, alternating, M)
    order = [(p, m + k * M) for m in range(M) for k in range(rows) for p in range(2)]
    # The single-process batch whose microbatch m (rows m, m + M, ...) holds `order`'s m-th block.
    single = [order[(i % M) * rows * 2 + i // M] for i in range(len(order))]
    want = batch_lib.prepare_batch(worker.global_batch(CFG, worker.process_batches(CFG, step), single), CFG,
                                   M).inputs.vision
    for name, a, b in zip(want._fields, got, want):
        np.testing.assert_array_equal(a, b, err_msg=name)


def test_budget_is_the_largest_bucket_times_processes_and_text_only_steps_have_no_vision():
    parts = _parts(0)
    assert [p.given for p in parts] == list(worker.BUCKETS) and [len(p.grids) for p in parts] == [4, 1]
    owners = np.array([(p, k) for p in range(2) for k in range(4)])  # one microbatch: 4 rows per process
    whole = global_images.global_vision(CFG, parts, owners, 1)
    assert whole.pixel_values.shape == (1, 2 * max(worker.BUCKETS), CFG.vision.patch_dim)
    assert int((whole.segment_ids > 0).sum()) == 16 + 32 + 32 + 16 + 16
    text = [p._replace(grids=p.grids[:0], pixels=p.pixels[:0], per_row=0 * p.per_row) for p in parts]
    assert global_images.global_vision(CFG, text, owners, 1) is None


def test_gather_in_one_process_returns_the_part_unpadded():
    part = _parts(0)[0]
    (got,) = global_images.gather_parts(part, CFG.vision.spatial_merge_size ** 2)
    for name, a, b in zip(part._fields, got, part):
        np.testing.assert_array_equal(a, b, err_msg=name)


def test_row_owners_follow_the_sharding():
    mesh = sharding.make_mesh((2, 4, 1))
    shape = (M, 16, 8)
    owners = global_images.row_owners(batch_lib.row_sharding(mesh, sharding.DEFAULT_RULES, shape, 1), shape)
    np.testing.assert_array_equal(owners, np.stack([np.zeros(16, int), np.arange(16)], 1))
    assert jax.process_count() == 1


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(name, args, devices, tmp_path):
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}",
               PYTHONPATH=str(REPO))
    log = open(tmp_path / f"{name}.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "tests.train.multiprocess_worker", *args], cwd=REPO, env=env,
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    return name, proc, log


def _run_all(procs, tmp_path, timeout: float = 600):
    """Waits for every process; on a crash or the timeout kills the others and fails showing the logs."""
    deadline = time.time() + timeout
    try:
        while time.time() < deadline:
            codes = {name: p.poll() for name, p, _ in procs}
            failed = [name for name, c in codes.items() if c not in (None, 0)]
            if failed:
                pytest.fail(f"{failed} exited with {[codes[n] for n in failed]}:\n" + _logs(procs, tmp_path))
            if all(c == 0 for c in codes.values()):
                return
            time.sleep(0.2)
        pytest.fail(f"timed out after {timeout} s:\n" + _logs(procs, tmp_path))
    finally:
        for _, p, log in procs:
            if p.poll() is None:
                p.kill()
            p.wait(timeout=60)
            log.close()


def _logs(procs, tmp_path) -> str:
    return "\n".join(f"--- {name} ---\n" + (tmp_path / f"{name}.log").read_text()[-4000:] for name, _, _ in procs)


@pytest.mark.slow
def test_two_processes_train_like_one_on_the_same_global_batch(tmp_path, tiny_checkpoint):
    common = ["--init", str(tiny_checkpoint)]
    (tmp_path / "ref").mkdir()
    (tmp_path / "mp").mkdir()
    # One after the other: on a 2-core machine, three concurrent processes can starve one of XLA's
    # in-process collective threads past its 40 s rendezvous limit (the process aborts).
    _run_all([_start("reference", [*common, "--workdir", str(tmp_path / "ref_wd"), "--out", str(tmp_path / "ref"),
                                   "--processes", "1"], 4, tmp_path)], tmp_path)
    port = _free_port()
    _run_all([_start(f"process{i}", [*common, "--workdir", str(tmp_path / "mp_wd"), "--out", str(tmp_path / "mp"),
                                     "--processes", "2", "--process-id", str(i), "--port", str(port)], 2, tmp_path)
              for i in range(2)], tmp_path)
    cfg = Qwen3VLConfig.from_hf_dict(json.loads((tiny_checkpoint / "config.json").read_text()))  # the workers' model
    ref = json.loads((tmp_path / "ref" / "report0.json").read_text())
    mp = [json.loads((tmp_path / "mp" / f"report{i}.json").read_text()) for i in range(2)]
    assert mp[0]["device_processes"] == [0, 0, 1, 1]

    # The global rows are process 0's, then process 1's (read back from the placed arrays) ...
    for step in range(worker.STEPS):
        parts = worker.process_batches(cfg, step)
        want = np.stack([np.concatenate([p["input_ids"][m::M] for p in parts]) for m in range(M)])
        for report in (ref, *mp):
            np.testing.assert_array_equal(np.array(report["placed_ids"][step]), want)
    # ... and every process built the single-process vision inputs, bit for bit.
    for step in range(worker.STEPS):
        assert ref["vision"][step] is not None
        assert mp[0]["vision"][step] == mp[1]["vision"][step] == ref["vision"][step], step
    # A mesh alternating processes along the batch interleaves their rows; a tensor axis over both processes makes
    # one feed: every row is the lead's, and a process's 2 rows per microbatch are the whole global batch's.
    assert mp[0]["alternating_owners"] == mp[1]["alternating_owners"] == [
        [0, 0], [0, 1], [1, 0], [1, 1], [0, 2], [0, 3], [1, 2], [1, 3]]
    for report in mp:
        assert report["feeds"] == [[0], [1]]
        assert report["tensor_only_owners"] == [[0, r] for r in range(8)]
        assert report["tensor_only_rows"] == 2

    assert mp[0]["steps"] == ref["steps"] == worker.STEPS
    assert sorted(mp[0]["losses"]) == sorted(ref["losses"]) == [str(s) for s in range(1, worker.STEPS + 1)]
    for step, loss in ref["losses"].items():
        assert abs(mp[0]["losses"][step] - loss) <= 1e-5, (step, mp[0]["losses"], ref["losses"])
    got, want, init = (np.load(tmp_path / d / f) for d, f in (("mp", "params.npz"), ("ref", "params.npz"),
                                                               ("ref", "init.npz")))
    assert sorted(got.files) == sorted(want.files) == sorted(init.files)
    assert max(float(np.abs(want[k] - init[k]).max()) for k in want.files) > 1e-3  # the steps moved the model
    for k in want.files:
        np.testing.assert_allclose(got[k], want[k], atol=1e-5, rtol=0, err_msg=k)


@pytest.mark.slow
def test_four_processes_whose_tensor_groups_span_two_train_like_one(tmp_path, tiny_checkpoint):
    # A pod whose tensor groups span two hosts, scaled down: 4 processes of 1 device, mesh (1, 2, 2); processes
    # 0-1 and 2-3 each hold one row block (a feed) and load the same rows, the images of their feed's rows.
    common = ["--init", str(tiny_checkpoint)]
    _run_all([_start("reference", [*common, "--workdir", str(tmp_path / "ref_wd"), "--out", str(tmp_path),
                                   "--processes", "1"], 4, tmp_path)], tmp_path)
    (tmp_path / "mp").mkdir()
    port = _free_port()
    _run_all([_start(f"process{i}", [*common, "--workdir", str(tmp_path / "mp_wd"), "--out", str(tmp_path / "mp"),
                                     "--processes", "4", "--process-id", str(i), "--port", str(port),
                                     "--mesh", "1,2,2"], 1, tmp_path) for i in range(4)], tmp_path)
    ref = json.loads((tmp_path / "report0.json").read_text())
    mp = [json.loads((tmp_path / "mp" / f"report{i}.json").read_text()) for i in range(4)]
    assert [r["feeds"] for r in mp] == [[[0, 1], [2, 3]]] * 4
    for step in range(worker.STEPS):  # the same global rows and vision inputs as one process on the global batch
        for report in mp:
            assert report["placed_ids"][step] == ref["placed_ids"][step], step
            assert report["vision"][step] == ref["vision"][step], step
    assert mp[0]["steps"] == worker.STEPS
    for step, loss in ref["losses"].items():
        assert abs(mp[0]["losses"][step] - loss) <= 1e-5, (step, mp[0]["losses"], ref["losses"])
    got, want = np.load(tmp_path / "mp" / "params.npz"), np.load(tmp_path / "params.npz")
    for k in want.files:
        np.testing.assert_allclose(got[k], want[k], atol=1e-5, rtol=0, err_msg=k)
