"""The path layer (rmsweb_jax/storage.py) on a local folder and on a GCS emulator (real HTTP, gcsfs, tensorstore)."""
import os
import uuid

import numpy as np
import pytest

from rmsweb_jax import storage
from rmsweb_jax.errors import UserError


@pytest.fixture(params=["local", "gcs"])
def folder(request, tmp_path):
    """Returns an empty folder: a local one, and one on the emulated bucket."""
    if request.param == "local":
        return tmp_path / "run"
    return f"{request.getfixturevalue('gcs_emulator')}/{uuid.uuid4().hex}"


def test_as_path_keeps_local_paths_pathlib_and_refuses_other_schemes(tmp_path):
    import pathlib
    assert type(storage.as_path(tmp_path)) is type(pathlib.Path(tmp_path))
    assert str(storage.as_path("gs://bucket/run") / "x") == "gs://bucket/run/x"
    with pytest.raises(UserError, match="s3:// scheme is not supported"):
        storage.as_path("s3://bucket/run")
    with pytest.raises(UserError, match="expected gs://BUCKET/FOLDER"):
        storage.as_path("gs:///run")
    with pytest.raises(UserError, match="reports = gs://b/x: this writes local files only"):
        storage.refuse_remote("gs://b/x", "reports")


def test_atomic_writes_read_back_and_replace_whole(folder):
    path = storage.as_path(folder) / "sub" / "a.json"
    storage.write_text_atomic(path, '{"v": 1}')
    storage.write_text_atomic(path, '{"v": 22}')
    assert path.read_text() == '{"v": 22}'
    assert [p.name for p in path.parent.iterdir()] == ["a.json"]  # no temp file left behind
    assert storage.file_digest(path) == __import__("hashlib").sha256(b'{"v": 22}').hexdigest()


def test_move_tree_moves_every_file(folder):
    root = storage.as_path(folder)
    storage.write_text_atomic(root / "sft" / "checkpoints" / "2" / "x", "xx")
    storage.write_text_atomic(root / "sft" / "split.json", "{}")
    storage.move_tree(root / "sft", root / "stale" / "sft-1" / "sft")
    assert not (root / "sft").exists()
    assert (root / "stale" / "sft-1" / "sft" / "checkpoints" / "2" / "x").read_text() == "xx"
    assert (root / "stale" / "sft-1" / "sft" / "split.json").read_text() == "{}"


def test_a_mirror_pulls_and_pushes_a_bucket_folder(gcs_emulator, tmp_path):
    remote = storage.as_path(f"{gcs_emulator}/{uuid.uuid4().hex}")
    storage.write_bytes_atomic(remote / "big.bin", os.urandom(3 << 20))
    storage.write_text_atomic(remote / "meta.json", "1")
    local = storage.pull_tree(remote)
    assert local == storage.mirror_dir(remote) and str(local).startswith(os.environ[storage.CACHE_ENV])
    assert (local / "big.bin").read_bytes() == (remote / "big.bin").read_bytes()
    (local / "stray").write_text("left by a writer killed before its upload")
    storage.write_text_atomic(remote / "meta.json", "2")  # rewritten in place, same size: pulled again
    storage.pull_tree(remote, keep=("lock",), rewritten=("meta.json",))
    assert (local / "meta.json").read_text() == "2" and not (local / "stray").exists()
    # An object rewritten with the same size (a retrained HF export): its modification time differs from the
    # one the mirror copy carries (set back here, rather than waiting out GCS's one-second resolution).
    storage.write_bytes_atomic(remote / "big.bin", os.urandom(3 << 20))
    os.utime(local / "big.bin", (0, 0))
    storage.pull_tree(remote)
    assert (local / "big.bin").read_bytes() == (remote / "big.bin").read_bytes()
    (local / "new.txt").write_text("n")
    (local / "lock").write_text("")
    storage.push_files(local, remote, ["new.txt"])
    assert (remote / "new.txt").read_text() == "n"
    (local / "big.bin").unlink()
    storage.push_tree(local, remote, skip=("lock",))
    assert storage.remote_files(remote) == {"meta.json": 1, "new.txt": 1}


def test_orbax_saves_and_restores_on_the_bucket_through_tensorstore(gcs_emulator):
    import jax.numpy as jnp
    import orbax.checkpoint as ocp
    directory = f"{gcs_emulator}/{uuid.uuid4().hex}/checkpoints"
    options = ocp.CheckpointManagerOptions(enable_async_checkpointing=False, create=True)
    with ocp.CheckpointManager(directory, options=options) as manager:
        manager.save(3, args=ocp.args.Composite(state=ocp.args.StandardSave({"w": jnp.arange(6.0)})))
    assert storage.remote_files(directory)  # the arrays went to the bucket, not to a local "gs:" folder
    assert not os.path.exists("gs:")
    with ocp.CheckpointManager(directory, options=options) as manager:
        assert manager.latest_step() == 3
        out = manager.restore(3, args=ocp.args.Composite(state=ocp.args.StandardRestore({"w": jnp.zeros(6)})))
    np.testing.assert_array_equal(out["state"]["w"], np.arange(6.0))


def test_a_listing_sees_what_another_process_wrote_since(gcs_emulator):
    """No stale listings: a process that listed a folder sees the objects another process adds later (a resumed
    run's checkpoints, another host's files)."""
    import subprocess
    import sys
    folder = storage.as_path(f"{gcs_emulator}/{uuid.uuid4().hex}")
    storage.write_text_atomic(folder / "a", "1")
    assert storage.remote_files(folder) == {"a": 1} and not (folder / "b").exists()
    subprocess.run([sys.executable, "-c", f"from rmsweb_jax import storage; "
                    f"storage.write_text_atomic({str(folder / 'b')!r}, '22')"], check=True, timeout=120,
                   env=dict(os.environ))
    assert storage.remote_files(folder) == {"a": 1, "b": 2} and (folder / "b").exists()
