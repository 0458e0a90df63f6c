"""Durable files: what the trajectory store and the task-file download both need (hashes, synced renames)."""
from __future__ import annotations

import hashlib
import os
import pathlib


def file_sha256(path: str | pathlib.Path) -> str:
    """Returns the hex sha256 of the file at `path` (read in 1 MiB blocks)."""
    with open(path, "rb") as f:
        return stream_sha256(f)


def stream_sha256(f) -> str:
    """Returns the hex sha256 of what is left to read in the binary file object `f` (read in 1 MiB blocks)."""
    digest = hashlib.sha256()
    for block in iter(lambda: f.read(1 << 20), b""):
        digest.update(block)
    return digest.hexdigest()


def fsync_file(path: str | pathlib.Path) -> None:
    """Flushes the file at `path` to disk (before renaming it into place)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(directory: pathlib.Path) -> None:
    """Makes the renames in `directory` durable (a rename is only on disk once its folder is synced)."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
