"""Listing a bucket folder's versions (storage.remote_versions, what every mirror pull and push starts with):
our one listing vs a walk with a stat per object, on a GCS emulator on 127.0.0.1.

Side by side in one run, on one folder of N objects in 3 subfolders (full: 1,000; --quick: 200):
  ours    rmsweb_jax.storage.remote_versions: one fsspec `find(detail=True)`, sizes and times from the listing
  anchor  the obvious etils.epath version: `walk()` the folder, then `stat()` each object (a request each)
Both must return the same {path: (bytes, seconds)}. The emulator answers in about a millisecond, so the ratio
understates the gain on a real bucket, where each stat is a round trip of tens of milliseconds.
Ends with one JSON line (goal: ratio <= 0.5).

    .venv/bin/python bench/gcs_listing.py [--quick]
"""
from __future__ import annotations

import argparse
import os
import pathlib
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.report import emit  # noqa: E402
from tests.storage_emulator import BUCKET, emulator_env, start_emulator  # noqa: E402


def walk_and_stat(remote) -> dict[str, tuple[int, int]]:
    """The anchor: every object found by walking the folder, then stat()ed one by one."""
    from rmsweb_jax import storage
    remote = storage.as_path(remote)
    prefix, found = str(remote)[len(storage.SCHEME):].strip("/"), {}
    for folder, _, files in remote.walk():
        rel_folder = str(folder).strip("/")[len(prefix):].strip("/")
        for name in files:
            rel = f"{rel_folder}/{name}" if rel_folder else name
            stat = (remote / rel).stat()
            found[rel] = (stat.length, int(stat.mtime))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="200 objects, 3 repeats (well under a minute)")
    args = parser.parse_args()
    objects, repeats = (200, 3) if args.quick else (1000, 5)
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="gcs_listing_"))
    proc, url = start_emulator(tmp / "emulator.log")
    try:
        os.environ.update(emulator_env(url, tmp / "cache"))
        from rmsweb_jax import storage
        root = storage.as_path(f"gs://{BUCKET}/listing")
        for i in range(objects):
            (root / f"part{i % 3}" / f"object{i}.bin").write_bytes(b"x" * (i % 97))
        assert storage.remote_versions(root) == walk_and_stat(root), "the two listings differ"
        times = {"ours": [], "anchor": []}
        for _ in range(repeats):  # interleaved, so that drift hits both alike
            for name, fn in (("ours", storage.remote_versions), ("anchor", walk_and_stat)):
                start = time.perf_counter()
                fn(root)
                times[name].append(time.perf_counter() - start)
        ours, anchor = (1e3 * statistics.median(times[k]) for k in ("ours", "anchor"))
        print(f"{objects} objects: one listing {ours:.1f} ms, walk + stat each {anchor:.1f} ms (medians of {repeats})")
        emit("gcs_listing", ours, anchor, "ms per listing", 0.5, objects=objects)
    finally:
        proc.kill()


if __name__ == "__main__":
    main()
