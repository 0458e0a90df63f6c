"""A small filesystem to fill: a tmpfs of a given size, mounted for one test (root only; the test skips, saying
why, where mounting is not allowed), which can grow in place as a user frees space."""
import contextlib
import os
import pathlib
import subprocess

import pytest


@contextlib.contextmanager
def small_tmpfs(folder: pathlib.Path, size: str):
    """Yields `folder` with a tmpfs of `size` ('5m') mounted on it; unmounted after."""
    folder.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)], capture_output=True,
                          text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], capture_output=True)


def grow(folder: pathlib.Path, size: str) -> None:
    """Grows the tmpfs on `folder` to `size`, its files kept (space freed)."""
    subprocess.run(["mount", "-o", f"remount,size={size}", str(folder)], check=True)
