"""The trajectory store on a bucket (GCS emulator): flushes committed by their marker on the bucket, read
from another host's mirror, a writer killed between uploads leaves only whole flushes."""
import os
import subprocess
import sys
import textwrap
import uuid

from rmsweb_jax import storage
from rmsweb_jax.collect.sft_view import SFTView
from rmsweb_jax.collect.store import STEPS, STORE_FILE, TRAJECTORIES, TrajectoryStore
from rmsweb_jax.collect.store_fixture import retry_group as group
from rmsweb_jax.collect.store_layout import marker_name, shard_name
from tests.settings import COLLECT, store_writer


def _other_host(monkeypatch, tmp_path, name):
    """Points the bucket mirrors at a fresh folder: what another host (or a fresh machine) would see."""
    monkeypatch.setenv(storage.CACHE_ENV, str(tmp_path / name))


def test_a_store_on_the_bucket_round_trips_and_another_host_reads_it(gcs_emulator, tmp_path, monkeypatch):
    remote = f"{gcs_emulator}/{uuid.uuid4().hex}/store"
    groups = [group(f"task{i}", i % 2, solved_at=[1, 2, None][i % 3]) for i in range(4)]
    with store_writer(remote, flush_every_tasks=2, flush_every_s=3600, policy="teacher") as store:
        for g in groups:
            store.add_group(g)
        store.claim_retry_mode("reflection")
    assert not os.path.exists("gs:")  # nothing went to a local folder named after the URL
    assert set(storage.remote_files(remote)) == {STORE_FILE, marker_name(1), marker_name(2),
                                                 *(shard_name(k, s) for k in (STEPS, TRAJECTORIES) for s in (1, 2))}
    _other_host(monkeypatch, tmp_path, "host2")
    reader = TrajectoryStore(remote)
    assert reader.location == remote and reader.retry_mode == "reflection" and reader.policy == "teacher"
    want = [traj for g in groups for traj, _ in g]
    assert [t.request_id for t in reader.trajectories()] == [t.request_id for t in want]
    steps = {traj.request_id: s for g in groups for traj, s in g}
    assert all(reader.steps(t) == steps[t.request_id] for t in reader.trajectories())
    view = SFTView(remote)  # Grain reads the mirror's shards
    assert len(view) == sum(len(s) for g in groups for t, s in g if t.success)
    assert view[0].step == steps[view[0].request_id][view[0].step.step]
    with store_writer(remote, flush_every_tasks=1, policy="teacher") as store:  # a resumed collection
        store.add_group(group("task9", 0, solved_at=1))
    _other_host(monkeypatch, tmp_path, "host3")
    assert TrajectoryStore(remote).committed_flushes() == [1, 2, 3]


def test_a_writer_killed_before_its_marker_reaches_the_bucket_leaves_whole_flushes(gcs_emulator, tmp_path,
                                                                                    monkeypatch):
    """A real SIGKILL after the flush's shards are uploaded and its marker is written locally, before the
    marker's upload: the bucket holds two uncommitted shards, which a reader ignores and a writer removes."""
    remote = f"{gcs_emulator}/{uuid.uuid4().hex}/store"
    script = textwrap.dedent(f"""
        import os, signal
        from rmsweb_jax import storage
        from rmsweb_jax.collect.store import StoreWriter
        from rmsweb_jax.collect.store_fixture import retry_group as group
        w = StoreWriter({remote!r}, flush_every_tasks=1, flush_every_s={COLLECT.flush_every_s!r})
        w.add_group(group("a", 0, solved_at=1))
        real = storage.upload
        def dying(local, dest):
            if str(dest).endswith({marker_name(2)!r}):
                os.kill(os.getpid(), signal.SIGKILL)
            real(local, dest)
        storage.upload = dying
        w.add_group(group("b", 0, solved_at=2))
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=180, env=dict(os.environ))
    assert proc.returncode == -9, proc.stderr.decode()[-2000:]
    on_bucket = set(storage.remote_files(remote))
    assert {shard_name(STEPS, 2), shard_name(TRAJECTORIES, 2)} <= on_bucket and marker_name(2) not in on_bucket
    # The killed writer's own mirror holds the marker; the bucket decides: a pull drops it.
    assert (storage.mirror_dir(remote) / marker_name(2)).exists()
    assert TrajectoryStore(remote).finished_task_keys() == {("a", 0)}
    with store_writer(remote) as store:
        assert store.removed_orphans == sorted([shard_name(STEPS, 2), shard_name(TRAJECTORIES, 2)])
        store.add_group(group("b", 0, solved_at=2))
    _other_host(monkeypatch, tmp_path, "fresh")
    assert TrajectoryStore(remote, verify="full").finished_task_keys() == {("a", 0), ("b", 0)}


def test_the_check_command_reads_a_bucket_store_and_repair_asks_for_a_local_copy(gcs_emulator, capsys):
    from rmsweb_jax.collect.store_check import main
    remote = f"{gcs_emulator}/{uuid.uuid4().hex}/store"
    with store_writer(remote, flush_every_tasks=1) as store:
        store.add_group(group("a", 0, solved_at=1))
    assert main(["--check", remote]) == 0
    assert main(["--repair", remote]) == 2
    assert "--repair = gs://" in capsys.readouterr().err
