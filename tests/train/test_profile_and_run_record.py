"""A profile of steps START..STOP and the run's record (config and identity in config.json, TensorBoard text and
hparams, a W&B run in offline mode), from one real Trainer run on the tiny model, read back with plain tools: the
.xplane.pb as protobuf wire format, the Perfetto trace as gzipped JSON, the event files with tensorboardX's protos."""
import gzip
import json
import os
import pathlib
import struct
import subprocess

import pytest

from configs.common import base_config
from rmsweb_jax.errors import UserError
from rmsweb_jax.train import SyntheticBatches, Trainer, random_examples
from rmsweb_jax.train.profiling import parse_profile_steps

REPO = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def trained(tmp_path_factory, tiny_checkpoint):
    """Returns the workdir of a 3-step run profiled over steps 2..3, logging to W&B offline when wandb is there."""
    workdir = tmp_path_factory.mktemp("profiled")
    c = base_config()
    c.model.init = f"hf:{tiny_checkpoint}"
    c.mesh.shape = (1, 1, 1)
    c.train.batch_size = 8
    c.train.optimizer.total_steps = 3
    c.train.optimizer.warmup_steps = 1
    c.train.metrics.every_steps = 1
    c.train.export_hf = False
    c.train.profile_steps = "2,3"
    try:
        import wandb  # noqa: F401
        c.train.metrics.wandb = "rmsweb-test"
    except ImportError:
        pass
    env = {"WANDB_MODE": "offline", "WANDB_SILENT": "true"}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        trainer = Trainer(c, workdir, name="sft")
        trainer.fit(SyntheticBatches(random_examples(trainer.model_config, count=8, seq_len=32, seed=0), batch_size=8))
    finally:
        for k, v in saved.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
    return workdir


def _protobuf_fields(data: bytes) -> list[tuple[int, int, bytes | int]]:
    """Returns the (field number, wire type, value) of each field of a serialized protobuf message; raises on bytes
    that are not one (a truncated or garbage file)."""
    def varint(pos):
        shift = value = 0
        while True:
            byte = data[pos]
            value |= (byte & 0x7F) << shift
            pos += 1
            if byte < 0x80:
                return value, pos
            shift += 7
    fields, pos = [], 0
    while pos < len(data):
        key, pos = varint(pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = varint(pos)
        elif wire == 2:
            length, pos = varint(pos)
            value, pos = data[pos:pos + length], pos + length
            assert pos <= len(data), "a length-delimited field runs past the end"
        elif wire in (1, 5):
            size = 8 if wire == 1 else 4
            value, pos = data[pos:pos + size], pos + size
        else:
            raise AssertionError(f"wire type {wire} at byte {pos}: not a protobuf message")
        fields.append((number, wire, value))
    return fields


def test_the_profile_of_the_steps_is_written_where_tensorboard_reads_it(trained):
    runs = sorted((trained / "sft" / "tensorboard" / "plugins" / "profile").iterdir())
    assert len(runs) == 1, runs  # one trace for the window, not one per step
    xplanes = list(runs[0].glob("*.xplane.pb"))
    assert len(xplanes) == 1 and xplanes[0].stat().st_size > 1000
    # XSpace: field 1 = repeated XPlane; XPlane: field 2 = name. The host plane and the device plane are there.
    planes = [value for number, wire, value in _protobuf_fields(xplanes[0].read_bytes()) if number == 1 and wire == 2]
    by_name = {next(v.decode() for n, w, v in _protobuf_fields(plane) if n == 2): plane for plane in planes}
    assert "/host:CPU" in by_name, sorted(by_name)  # (on an accelerator a /device: plane beside it)
    lines = [v for n, w, v in _protobuf_fields(by_name["/host:CPU"]) if n == 3]  # XPlane field 3: XLines
    assert lines, "the host plane holds no timeline"
    trace = json.loads(gzip.decompress((runs[0] / "perfetto_trace.json.gz").read_bytes()))
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    assert any("train_step" in str(e.get("name", "")) or "jit" in str(e.get("name", "")) for e in events), events[:20]


def test_a_bad_profile_window_names_the_key():
    assert parse_profile_steps("") is None and parse_profile_steps("3,5") == (3, 5) and parse_profile_steps("1,1")
    for bad in ("5", "5,3", "0,2", "a,b", "1,2,3"):
        with pytest.raises(UserError, match=r"config.train.profile_steps = .*expected 'START,STOP'"):
            parse_profile_steps(bad)


def test_config_json_holds_the_resolved_config_and_the_run_identity(trained):
    saved = json.loads((trained / "config.json").read_text())
    assert saved["train"]["profile_steps"] == "2,3" and saved["train"]["optimizer"]["total_steps"] == 3
    identity = saved["run_identity"]
    commit = identity["git_commit"]  # a commit of this checkout (HEAD then; others may have committed since)
    assert len(commit) == 40 and subprocess.run(["git", "-C", str(REPO), "cat-file", "-e", f"{commit}^{{commit}}"]
                                                ).returncode == 0, commit
    assert isinstance(identity["git_dirty"], bool) and identity["stage"] == "sft"
    assert identity["versions"]["jax"] and identity["versions"]["jax"] != "not installed"
    assert identity["devices"]["count"] >= 1 and identity["devices"]["platform"] == "cpu"
    assert identity["mesh"] is None  # mesh.shape (1, 1, 1): one device, unsharded (a sharded run: {"fsdp": 8, ...})


def test_tensorboard_holds_the_config_as_text_and_hparams(trained):
    from tensorboardX.proto import event_pb2
    from tensorboardX.proto.plugin_hparams_pb2 import HParamsPluginData
    texts, hparams = {}, {}
    for path in (trained / "sft" / "tensorboard").glob("events.out.tfevents.*"):
        for record in _tf_records(path.read_bytes()):
            event = event_pb2.Event.FromString(record)
            for value in event.summary.value:
                plugin = value.metadata.plugin_data.plugin_name
                if plugin == "text":
                    texts[value.tag] = b"".join(value.tensor.string_val).decode()
                elif plugin == "hparams":
                    data = HParamsPluginData.FromString(value.metadata.plugin_data.content)
                    if data.HasField("session_start_info"):
                        hparams = {k: v for k, v in data.session_start_info.hparams.items()}
    assert '"total_steps": 3' in texts["run/config/text_summary"]
    assert '"git_commit"' in texts["run/identity/text_summary"]
    assert hparams["train.optimizer.total_steps"].number_value == 3
    assert hparams["train.profile_steps"].string_value == "2,3" and hparams["git_commit"].string_value


def _tf_records(data: bytes) -> list[bytes]:
    """Returns the records of a TFRecord file: uint64 length, uint32 crc, data, uint32 crc (little-endian)."""
    out, pos = [], 0
    while pos + 12 <= len(data):
        (length,) = struct.unpack("<Q", data[pos:pos + 8])
        out.append(data[pos + 12:pos + 12 + length])
        pos += 12 + length + 4
    return out


def test_weights_and_biases_offline_run_holds_config_and_scalars(trained):
    pytest.importorskip("wandb", reason="the wandb extra is not installed (pip install 'rmsweb_jax[wandb]')")
    runs = list((trained / "sft" / "wandb").glob("offline-run-*"))
    assert len(runs) == 1, runs
    from wandb.proto import wandb_internal_pb2
    config, steps = {}, []
    for data in _wandb_records(next(runs[0].glob("*.wandb")).read_bytes()):
        record = wandb_internal_pb2.Record.FromString(data)
        if record.WhichOneof("record_type") == "run":
            config.update({item.key: json.loads(item.value_json) for item in record.run.config.update})
        elif record.WhichOneof("record_type") == "history":
            items = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
            if "train/loss" in items:
                steps.append(items["_step"])
    assert config["config"]["train"]["optimizer"]["total_steps"] == 3 and config["run_identity"]["stage"] == "sft"
    assert steps == [1, 2, 3]


def _wandb_records(data: bytes) -> list[bytes]:
    """Returns the serialized records of a .wandb file: a 7-byte header (":W&B", magic, version), then LevelDB-log
    blocks of 32 KiB, each chunk a 7-byte header (crc32, length, kind: 1 full, 2 first, 3 middle, 4 last)."""
    assert data[:4] == b":W&B", data[:7]
    records, partial, pos, block = [], b"", 7, 32768
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a chunk header is padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        if kind in (1, 2):
            partial = chunk
        elif kind in (3, 4):
            partial += chunk
        if kind in (1, 4):
            records.append(partial)
    return records
