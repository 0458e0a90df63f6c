"""One run per workdir (rmsweb_jax/workdir_lock.py): real processes racing for a local and a gs:// workdir, a
SIGKILLed holder's lock taken over, gs:// leases that expire unless renewed, the refusal through main."""
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from rmsweb_jax import workdir_lock
from rmsweb_jax.errors import UserError
from rmsweb_jax.workdir_lock import WorkdirLock, get_object

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _contenders(workdir, tmp_path, count=2):
    go, release = tmp_path / "go", tmp_path / "release"
    procs = [subprocess.Popen([sys.executable, "-m", "tests.lock_contender", str(workdir), str(go), str(release)],
                              cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(count)]
    return procs, go, release


def _race(workdir, tmp_path):
    """Returns the sorted exit codes and outputs of two contenders started together on `workdir`."""
    procs, go, release = _contenders(workdir, tmp_path)
    assert [p.stdout.readline().strip() for p in procs] == ["ready"] * len(procs)  # both imported: start together
    go.touch()
    outputs = {}
    # the loser answers at once; the winner holds the lock until every other contender has answered
    deadline = time.monotonic() + 120
    while len([p for p in procs if p.poll() is not None]) < len(procs) - 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    release.touch()
    for p in procs:
        out, err = p.communicate(timeout=120)
        outputs[p.pid] = (p.returncode, out + err)
    return sorted(outputs.values())


def _check_one_won(results):
    assert [code for code, _ in results] == [0, 2], results
    assert results[0][1].strip() == "won"
    refused = results[1][1].strip()
    assert refused.startswith("refused: workdir ") and "is in use by the run started" in refused
    assert "--config.force_unlock=true" in refused and len(refused.splitlines()) == 1, refused


def test_two_processes_racing_on_a_local_workdir_exactly_one_wins(tmp_path):
    _check_one_won(_race(tmp_path / "w", tmp_path))


def test_two_processes_racing_on_a_bucket_workdir_exactly_one_wins(gcs_emulator, tmp_path):
    _check_one_won(_race(f"{gcs_emulator}/race-{os.getpid()}", tmp_path))


def test_a_sigkilled_holders_lock_is_taken_by_the_next_run(tmp_path):
    workdir = tmp_path / "w"
    (procs := _contenders(workdir, tmp_path, count=1))[1].touch()
    holder = procs[0][0]
    assert [holder.stdout.readline().strip() for _ in range(2)] == ["ready", "won"]
    with pytest.raises(UserError, match=f"pid {holder.pid}"):
        WorkdirLock.acquire(workdir)
    holder.send_signal(signal.SIGKILL)
    holder.wait(timeout=60)
    with WorkdirLock.acquire(workdir) as lock:
        assert lock.record["pid"] == os.getpid() and lock.displaced is None
    with WorkdirLock.acquire(workdir):  # released: free again
        pass


def test_force_unlock_displaces_a_live_local_holder_and_names_it(tmp_path):
    first = WorkdirLock.acquire(tmp_path)
    second = WorkdirLock.acquire(tmp_path, force=True)
    assert second.displaced["token"] == first.record["token"]
    with pytest.raises(UserError, match="is in use by"):
        WorkdirLock.acquire(tmp_path)  # the new holder holds it; the displaced one's release leaves it alone
    first.release()
    with pytest.raises(UserError, match="is in use by"):
        WorkdirLock.acquire(tmp_path)
    second.release()
    WorkdirLock.acquire(tmp_path).release()


def test_a_bucket_lease_not_renewed_expires_and_a_renewed_one_does_not(gcs_emulator):
    workdir = f"{gcs_emulator}/lease-{os.getpid()}"
    renewed = WorkdirLock.acquire(workdir, lease_s=1.0, renew_s=0.2)
    first = get_object(renewed.path)[1]
    deadline = time.monotonic() + 2.5
    while time.monotonic() < deadline:  # 2.5 lease times: still held, because renewed
        with pytest.raises(UserError, match=f"pid {os.getpid()}"):
            WorkdirLock.acquire(workdir, lease_s=1.0)
        time.sleep(0.2)
    assert get_object(renewed.path)[1] != first  # renewals wrote new generations
    renewed._stop.set()  # the renewing thread stops as if its process had been frozen or killed
    renewed._thread.join()
    time.sleep(1.5)
    with WorkdirLock.acquire(workdir, lease_s=1.0) as taker:
        assert taker.displaced is None and get_object(taker.path)[0]["token"] == taker.record["token"]
    assert get_object(renewed.path) == (None, 0)  # released


def test_a_holder_whose_lease_was_taken_over_stops_its_run(gcs_emulator, monkeypatch):
    workdir = f"{gcs_emulator}/lost-{os.getpid()}"
    interrupted = threading.Event()
    monkeypatch.setattr(workdir_lock._thread, "interrupt_main", interrupted.set)
    holder = WorkdirLock.acquire(workdir, lease_s=60.0, renew_s=0.3)
    taker = WorkdirLock.acquire(workdir, force=True, renew_s=60.0)
    assert taker.displaced["token"] == holder.record["token"]
    assert interrupted.wait(timeout=30) and holder.lost
    holder.release()  # leaves the taker's lease alone
    assert get_object(taker.path)[0]["token"] == taker.record["token"]
    taker.release()


def test_main_refuses_a_second_run_in_one_line_with_status_2_and_writes_nothing(tmp_path):
    workdir = tmp_path / "w"
    with WorkdirLock.acquire(workdir):
        before = sorted(p.name for p in workdir.iterdir())
        run = subprocess.run([sys.executable, "-m", "rmsweb_jax.main", "--config=configs/demo.py",
                              f"--workdir={workdir}", "--config.stages=model"], cwd=REPO, capture_output=True,
                             text=True, timeout=300)
        assert run.returncode == 2, run.stderr[-3000:]
        lines = run.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"rmsweb: error: workdir {workdir} is in use by the run "
                                                       f"started "), lines
        assert f"pid {os.getpid()}" in lines[0]
        assert sorted(p.name for p in workdir.iterdir()) == before == ["run.lock"]


def test_main_refuses_an_empty_workdir_before_writing_anything(tmp_path):
    run = subprocess.run([sys.executable, "-m", "rmsweb_jax.main", f"--config={REPO}/configs/demo.py", "--workdir=",
                          "--config.stages=model"], cwd=tmp_path, env=dict(os.environ, PYTHONPATH=REPO),
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 2 and run.stderr.strip().splitlines() == [
        "rmsweb: error: --workdir is empty: give the folder (or gs://BUCKET/FOLDER) for this run's outputs "
        "(--verbosity=1 shows the traceback)"], run.stderr[-2000:]
    assert list(tmp_path.iterdir()) == []


def test_on_two_processes_process_0_takes_the_lock_and_both_stop_when_it_is_held(tmp_path):
    from tests.storage_emulator import free_port
    workdir, port = tmp_path / "w", free_port()

    def start(index):
        env = dict(os.environ, JAX_PLATFORMS="cpu", RMSWEB_DISTRIBUTED="1", JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}",
                   JAX_NUM_PROCESSES="2", JAX_PROCESS_ID=str(index), XLA_FLAGS="--xla_force_host_platform_device_count=1")
        return subprocess.Popen([sys.executable, "-m", "rmsweb_jax.main", "--config=configs/demo.py",
                                 f"--workdir={workdir}", "--config.stages=model"], cwd=REPO, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    with WorkdirLock.acquire(workdir):
        procs = [start(0), start(1)]
        errors = [p.communicate(timeout=300)[1] for p in procs]
    assert [p.returncode for p in procs] == [2, 2], errors
    lines = [[line for line in e.splitlines() if line.startswith("rmsweb: error:")] for e in errors]
    assert f"pid {os.getpid()}" in lines[0][0] and "is in use by the run started" in lines[0][0]
    assert lines[1] == [f"rmsweb: error: process 0 could not take the lock of workdir {workdir} (its log says why) "
                        "(--verbosity=1 shows the traceback)"]
    assert sorted(p.name for p in workdir.iterdir()) == ["run.lock"]
