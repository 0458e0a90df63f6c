"""Scalar curves read back from tensorboardX event files, without TensorFlow.

An event file is a sequence of TFRecords: uint64 length, uint32 masked CRC-32C of the length, the
serialized `Event` proto, uint32 masked CRC-32C of the data (all little-endian). The protos are
tensorboardX's own (`tensorboardX.proto.event_pb2`), the package the trainer writes with
(train/metrics.py), so reader and writer cannot drift apart. A record cut short at the end of a file
is what a writer still running (or killed) leaves: it ends that file quietly; a checksum that does
not match is damage and raises.
"""
from __future__ import annotations

import os
import pathlib
import struct

from rmsweb_jax.tensorboardx_import import tensorboardx

tensorboardx()  # the package first, without torch: its submodules below import it
from tensorboardX.proto import event_pb2  # noqa: E402
from tensorboardX.record_writer import masked_crc32c  # noqa: E402

EVENT_FILE_GLOB = "events.out.tfevents.*"


def _records(path: pathlib.Path):
    """Yields the data of each complete TFRecord in the file at `path`."""
    data = path.read_bytes()
    offset = 0
    while offset + 12 <= len(data):
        header = data[offset:offset + 8]
        (length,) = struct.unpack("<Q", header)
        (header_crc,) = struct.unpack("<I", data[offset + 8:offset + 12])
        if header_crc != masked_crc32c(header):
            raise ValueError(f"{path}: record header at byte {offset} fails its checksum: not a TensorBoard "
                             "event file, or a damaged one")
        end = offset + 12 + length + 4
        if end > len(data):
            return  # cut short by a writer still writing
        body = data[offset + 12:offset + 12 + length]
        (body_crc,) = struct.unpack("<I", data[end - 4:end])
        if body_crc != masked_crc32c(body):
            raise ValueError(f"{path}: record at byte {offset} fails its checksum: the event file is damaged")
        yield body
        offset = end


def read_scalars(logdir: str | os.PathLike) -> dict[str, list[tuple[int, float]]]:
    """Returns tag -> [(step, value)] sorted by step, from every event file under `logdir` (subfolders
    included); a step written twice (a resumed run) keeps the value written last."""
    logdir = pathlib.Path(logdir)
    if not logdir.is_dir():
        raise FileNotFoundError(f"{logdir}: no such TensorBoard log folder (a training stage writes "
                                "<run dir>/tensorboard)")
    files = sorted(logdir.rglob(EVENT_FILE_GLOB))
    if not files:
        raise FileNotFoundError(f"{logdir}: no TensorBoard event files ({EVENT_FILE_GLOB}) in it")
    latest: dict[str, dict[int, tuple[float, float]]] = {}  # tag -> step -> (wall time, value)
    for path in files:
        for record in _records(path):
            event = event_pb2.Event.FromString(record)
            if not event.HasField("summary"):
                continue
            for value in event.summary.value:
                kind = value.WhichOneof("value")
                if kind == "simple_value":
                    number = float(value.simple_value)
                elif kind == "tensor" and len(value.tensor.float_val) == 1:
                    number = float(value.tensor.float_val[0])
                else:
                    continue  # images, histograms, text: not scalars
                steps = latest.setdefault(value.tag, {})
                seen = steps.get(event.step)
                if seen is None or event.wall_time >= seen[0]:
                    steps[event.step] = (event.wall_time, number)
    return {tag: [(step, v) for step, (_, v) in sorted(steps.items())] for tag, steps in sorted(latest.items())}
