"""Durable renames: what the trajectory store and the task-file download both need after os.replace."""
from __future__ import annotations

import os
import pathlib


def fsync_dir(directory: pathlib.Path) -> None:
    """Makes the renames in `directory` durable (a rename is only on disk once its folder is synced)."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
