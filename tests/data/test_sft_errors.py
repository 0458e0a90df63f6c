"""Bad input to the SFT data and stage: missing, empty or other-schema stores; a batch the mesh cannot split."""
import json
import os
import subprocess
import sys

import msgpack
import pytest
from array_record.python.array_record_module import ArrayRecordReader, ArrayRecordWriter

from rmsweb_jax.collect.records import SCHEMA_VERSION, SchemaError
from rmsweb_jax.collect.sft_view import SFTView
from rmsweb_jax.collect.store import STORE_FILE, StoreError
from rmsweb_jax.collect.store_fixture import task_group, write_synthetic_store
from rmsweb_jax.stages import sft
from tests.settings import store_writer

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _config(store):
    from configs.common import base_config
    config = base_config()
    config.data.store_dir = str(store)
    return config


def test_missing_store_is_named(tmp_path):
    with pytest.raises(StoreError, match=rf"no trajectory store at {tmp_path / 'nowhere'} \(missing store.json\)"):
        sft.run(_config(tmp_path / "nowhere"), tmp_path)


def test_empty_store_and_store_without_successes_are_named(tmp_path):
    store_writer(tmp_path / "empty").close()
    with pytest.raises(StoreError, match=rf"the trajectory store at {tmp_path / 'empty'} holds no trajectories"):
        sft.run(_config(tmp_path / "empty"), tmp_path)
    with store_writer(tmp_path / "failed") as store:
        failed, _ = task_group("synthetic.form-0", 0, fail_first=True, viewport=(200, 120), variant=0)
        store.add_group([failed])  # only the failed attempt
    with pytest.raises(StoreError, match=r"holds 1 trajectories, 0 successful, but no successful step"):
        SFTView(tmp_path / "failed")


def test_store_of_another_schema_version_is_named(tmp_path):
    store = write_synthetic_store(tmp_path / "old", tasks=1, seeds=1)
    meta = json.loads((store / STORE_FILE).read_text())
    (store / STORE_FILE).write_text(json.dumps({**meta, "schema_version": SCHEMA_VERSION + 1}))
    with pytest.raises(StoreError, match=rf"store {store} has schema version {SCHEMA_VERSION + 1}; this code reads "
                                         rf"version {SCHEMA_VERSION}"):
        sft.run(_config(store), tmp_path)
    # Records of another version inside a store that claims this one are refused too.
    (store / STORE_FILE).write_text(json.dumps(meta))
    shard = next(store.glob("trajectories-*.arrayrecord"))
    reader = ArrayRecordReader(str(shard))
    records = [msgpack.unpackb(r, raw=False) for r in reader.read_all()]
    reader.close()
    writer = ArrayRecordWriter(str(shard), "group_size:1")
    for r in records:
        writer.write(msgpack.packb({**r, "schema": SCHEMA_VERSION + 1}, use_bin_type=True))
    writer.close()
    with pytest.raises(SchemaError, match=rf"record has schema version {SCHEMA_VERSION + 1}"):
        SFTView(store)


def test_batch_that_does_not_divide_over_the_mesh_reaches_the_user(tmp_path):
    store = write_synthetic_store(tmp_path / "store", tasks=1, seeds=2)
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8", JAX_PLATFORMS="cpu")
    proc = subprocess.run(
        [sys.executable, "-m", "rmsweb_jax.main", "--config=configs/demo.py", f"--workdir={tmp_path}",
         "--config.stages=sft", "--config.sft.init=model", "--config.train.batch_size=3",
         f"--config.data.store_dir={store}"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode != 0
    assert "config.train.batch_size = 3 with 1 microbatch(es) gives 3 rows per microbatch, which do not divide " \
           "over the mesh's data x fsdp = 8 devices" in proc.stderr, proc.stderr[-2000:]
