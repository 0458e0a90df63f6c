"""The task-file download: a mirror on 127.0.0.1 in raw.githubusercontent.com's layout
(<owner>/<repo>/<commit>/<path>) serves the real files ($RMSWEB_BENCHMARKS) or the fixture files;
checksums, atomic writes, progress lines and the command line are the real thing."""
import dataclasses
import hashlib
import http.server
import os
import pathlib
import re
import subprocess
import sys
import threading

import pytest

from rmsweb_jax.suites import download as dl
from tests import benchmark_fixtures as fx

REPO = pathlib.Path(__file__).resolve().parents[2]


class Mirror:
    """A static file server on 127.0.0.1: `files` maps URL paths to bytes; `truncated` paths
    announce their full length but send half and close. Every GET path lands in `requests`."""

    def __init__(self, files: dict[str, bytes], truncated: frozenset[str] = frozenset()):
        self.files, self.truncated, self.requests = files, truncated, []
        mirror = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                mirror.requests.append(self.path)
                body = mirror.files.get(self.path)
                if body is None:
                    self.send_error(404, "Not Found")
                    return
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body[:len(body) // 2] if self.path in mirror.truncated else body)
                if self.path in mirror.truncated:
                    self.close_connection = True

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.base_url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def close(self):
        self._server.shutdown()
        self._server.server_close()


def url_path(file: dl.TaskFile) -> str:
    return dl.url_of(file, "")


def fixture_bytes() -> dict[str, bytes]:
    return {name: fx.file_text(name).encode() for name in fx.BUILDERS}


def pinned_to(files: dict[str, bytes]) -> list[dl.TaskFile]:
    """Returns TASK_FILES with each sha256 replaced by that of `files[name]`."""
    return [dataclasses.replace(f, sha256=hashlib.sha256(files[f.name]).hexdigest()) for f in dl.TASK_FILES]


@pytest.fixture()
def mirror_of():
    mirrors = []

    def start(files: dict[str, bytes], **kw) -> Mirror:
        mirrors.append(Mirror({url_path(f): files[f.name] for f in dl.TASK_FILES if f.name in files}, **kw))
        return mirrors[-1]

    yield start
    for mirror in mirrors:
        mirror.close()


def run_cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "rmsweb_jax.suites.download", *args], capture_output=True, text=True,
                          cwd=REPO, env={**os.environ, **(env or {})}, timeout=120)


def files_under(folder):
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


def test_the_table_names_every_file_once_with_a_pin():
    names = [f.name for f in dl.TASK_FILES]
    assert sorted(names) == sorted(fx.BUILDERS) and len(set(names)) == len(names)
    assert {f.suite for f in dl.TASK_FILES} == set(dl.SUITES) == set(dl.DEFAULT_TASK_FILES)
    assert all(name in names for name in dl.DEFAULT_TASK_FILES.values())
    for f in dl.TASK_FILES:
        assert f.name.startswith(f"{f.suite}/") and re.fullmatch(r"[0-9a-f]{64}", f.sha256)
        assert re.fullmatch(r"[0-9a-f]{40}", f.commit) or (f.commit == "main" and not f.confirmed)
    assert [f.name for f in dl.files_of("webtailbench")] == ["webtailbench/stagehand_WebTailBench_data.jsonl",
                                                               "webtailbench/molmoweb_webtailbench.json"]
    assert dl.files_of("all") == list(dl.TASK_FILES)
    with pytest.raises(ValueError, match=r"--suite='miniwob': expected one of \['webvoyager'"):
        dl.files_of("miniwob")
    assert dl.url_of(dl.TASK_FILES[2]) == ("https://raw.githubusercontent.com/MinorJerry/WebVoyager/"
                                           "091544539eba485dbd74ef3742011ddeede37336/data/GAIA_web.jsonl")


def test_pinned_checksums_are_those_of_the_real_files(benchmarks_dir):
    assert {f.name: dl.sha256_of(benchmarks_dir / f.name) for f in dl.TASK_FILES} == {
        f.name: f.sha256 for f in dl.TASK_FILES}


def test_download_writes_every_file_and_skips_those_present(tmp_path, mirror_of, benchmark_files):
    # The fixture files with their own checksums, or the real files with the pinned ones.
    served = {name: (benchmark_files / name).read_bytes() for name in fx.BUILDERS}
    mirror = mirror_of(served)
    files = pinned_to(served)
    dest = tmp_path / "data"
    lines = []
    paths = dl.download(files, dest, mirror.base_url, log=lines.append)
    assert paths == [dest / f.name for f in files]
    assert {f.name: (dest / f.name).read_bytes() for f in files} == served
    assert files_under(dest) == sorted(served)  # no temporary file left
    assert sorted(mirror.requests) == sorted(url_path(f) for f in files)
    assert len(lines) == 2 * len(files)  # "fetching <url>" then "<n> bytes, sha256 ok", per file
    assert lines[0] == f"[1/{len(files)}] {files[0].name}: fetching {dl.url_of(files[0], mirror.base_url)}"
    assert lines[1] == f"[1/{len(files)}] {files[0].name}: {len(served[files[0].name])} bytes, sha256 ok"

    # Present with the pinned bytes: not fetched again. A damaged copy is fetched and replaced.
    damaged = dest / files[3].name
    damaged.write_bytes(b"half a file")
    mirror.requests.clear()
    lines.clear()
    dl.download(files, dest, mirror.base_url, log=lines.append)
    assert mirror.requests == [url_path(files[3])]
    assert damaged.read_bytes() == served[files[3].name]
    assert sum(line.endswith("already present, sha256 ok") for line in lines) == len(files) - 1


def test_a_checksum_mismatch_writes_nothing_and_keeps_the_old_file(tmp_path, mirror_of):
    served = fixture_bytes()
    mirror = mirror_of(served)
    [file] = [f for f in pinned_to(served) if f.name == "webvoyager/GAIA_web.jsonl"]
    wrong = dataclasses.replace(file, sha256="0" * 64)
    dest = tmp_path / "data"
    with pytest.raises(dl.ChecksumMismatch) as e:
        dl.fetch(wrong, dest, mirror.base_url)
    assert str(e.value).startswith(f"webvoyager/GAIA_web.jsonl: the file at {mirror.base_url}{url_path(file)} has "
                                   f"sha256 {file.sha256}, expected {'0' * 64}; refusing it (nothing written)")
    assert files_under(dest) == []
    old = dest / file.name
    old.write_bytes(b"the copy from last year")
    with pytest.raises(dl.ChecksumMismatch):
        dl.fetch(wrong, dest, mirror.base_url)
    assert old.read_bytes() == b"the copy from last year" and files_under(dest) == [file.name]


def test_http_errors_and_cut_downloads_name_the_url_and_leave_nothing(tmp_path, mirror_of):
    served = fixture_bytes()
    files = {f.name: f for f in pinned_to(served)}
    cut = files["webtailbench/stagehand_WebTailBench_data.jsonl"]
    mirror = mirror_of({name: body for name, body in served.items() if name != "webvoyager/GAIA_web.jsonl"},
                       truncated=frozenset({url_path(cut)}))
    dest = tmp_path / "data"
    missing = files["webvoyager/GAIA_web.jsonl"]
    with pytest.raises(dl.DownloadError, match=rf"GAIA_web.jsonl: GET {re.escape(mirror.base_url)}/MinorJerry/"
                                               r"WebVoyager/0915\w+/data/GAIA_web.jsonl answered HTTP 404"):
        dl.fetch(missing, dest, mirror.base_url)
    with pytest.raises(dl.DownloadError, match=r"stagehand_WebTailBench_data.jsonl: GET .* failed: the connection "
                                               r"closed after \d+ of \d+ bytes"):
        dl.fetch(cut, dest, mirror.base_url)
    closed = Mirror({})
    closed.close()  # nothing listens on its port any more
    with pytest.raises(dl.DownloadError, match=r"GET http://127.0.0.1:\d+/.* failed: .*[Cc]onnection refused"):
        dl.fetch(missing, dest, closed.base_url)
    assert files_under(dest) == []


def test_cli_refuses_files_that_differ_from_the_pins(tmp_path, mirror_of):
    # The fixture files are not the pinned ones: the command stops at the first, writes nothing,
    # and says which file, the expected and the got sha256. Base URL and data dir from the env.
    served = fixture_bytes()
    mirror = mirror_of(served)
    result = run_cli("--suite=online_mind2web", env={"RMSWEB_BENCHMARKS_URL": mirror.base_url,
                                                     "RMSWEB_DATA": str(tmp_path / "data")})
    assert result.returncode == 1
    first = dl.files_of("online_mind2web")[0]
    got = hashlib.sha256(served[first.name]).hexdigest()
    assert f"error: {first.name}: the file at {mirror.base_url}{url_path(first)} has sha256 {got}, expected " \
           f"{first.sha256}" in result.stderr
    assert f"[1/3] {first.name}: fetching {mirror.base_url}" in result.stdout
    assert mirror.requests == [url_path(first)]
    assert not (tmp_path / "data").exists() or files_under(tmp_path / "data") == []
    bad = run_cli("--suite=miniwob")
    assert bad.returncode == 2 and "invalid choice: 'miniwob'" in bad.stderr


def test_cli_downloads_the_real_files_from_a_mirror(tmp_path, mirror_of, benchmarks_dir):
    served = {f.name: (benchmarks_dir / f.name).read_bytes() for f in dl.TASK_FILES}
    mirror = mirror_of(served)
    dest = tmp_path / "data"
    result = run_cli("--suite=all", f"--dest={dest}", f"--base_url={mirror.base_url}/")
    assert result.returncode == 0, result.stderr
    assert {name: (dest / name).read_bytes() for name in served} == served and files_under(dest) == sorted(served)
    assert result.stdout.count("sha256 ok") == len(served) and f"all: task files in {dest}" in result.stdout
    again = run_cli("--suite=webvoyager", f"--dest={dest}", f"--base_url={mirror.base_url}")
    assert again.returncode == 0 and again.stdout.count("already present, sha256 ok") == 5
    assert len(mirror.requests) == len(served)
