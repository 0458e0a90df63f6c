"""Downloads the live benchmarks' official task files at pinned commits, each checked by sha256.

    python -m rmsweb_jax.suites.download --suite=all                     # into the default data dir
    python -m rmsweb_jax.suites.download --suite=webvoyager --dest=/data/benchmarks

Suites: webvoyager, online_mind2web, webtailbench (or all). MiniWoB++ needs no download: its pages
come with the `miniwob` package and its task table with rmsweb_jax (suites/miniwob_tasks.csv).

Default data dir: $RMSWEB_DATA when set, else ~/.cache/rmsweb_jax/benchmarks. The collect stage
reads a live suite's task file from there when collect.task_list is empty (DEFAULT_TASK_FILES).
Layout: <dir>/<suite>/<file>, the layout of the project's ../shared/benchmarks, so
RMSWEB_BENCHMARKS=<dir> also runs the tests on the real files.

Why each piece:
- Pinned commit + sha256: a benchmark's numbers are only comparable on the same task list; a file
  whose bytes differ from the pinned ones is refused (nothing is written), never used silently.
- Atomic writes (temporary file in the destination folder, fsync, os.replace): a killed download
  leaves either the old file or the new one, never half a file that a loader would half-read.
- --base_url (or $RMSWEB_BENCHMARKS_URL) replaces https://raw.githubusercontent.com: a mirror, or
  the tests' server on 127.0.0.1. File URLs are <base_url>/<owner>/<repo>/<commit>/<path>.
- A file already present with the pinned sha256 is not fetched again.

Commits: where an entry says `confirmed`, a stored copy of the repository at that commit was seen
to hold the file (same length, same text where read). The others use "main" (or a commit seen only
in a fork) until one is confirmed; their sha256, of the bytes this project was built and tested on,
still pins them: if upstream changes the file, the download stops with a checksum mismatch rather
than fetch other tasks.
"""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import http.client
import os
import pathlib
import sys
import tempfile
import urllib.error
import urllib.request
from typing import Callable, Iterable, Iterator

from rmsweb_jax.durable import file_sha256 as sha256_of, fsync_dir

GITHUB_RAW = "https://raw.githubusercontent.com"
SUITES = ("webvoyager", "online_mind2web", "webtailbench")
TIMEOUT_S = 60.0  # per request: the largest file (WebTailBench, 2 MB) takes seconds


@dataclasses.dataclass(frozen=True)
class TaskFile:
    """One benchmark task file: where it goes (`name`, relative to the data dir), where it comes
    from (`repo` at `commit`, `path`), and the sha256 of its bytes."""

    suite: str
    name: str
    repo: str
    commit: str
    path: str
    sha256: str
    confirmed: bool  # a stored copy of `repo` at `commit` was seen to hold these bytes


TASK_FILES = (
    # MinorJerry/WebVoyager: WebVoyager_data.jsonl and reference_answer.json were added after
    # 0915445 (that commit names the task file data/tasks_test.jsonl); their commit is unconfirmed.
    TaskFile("webvoyager", "webvoyager/WebVoyager_data.jsonl", "MinorJerry/WebVoyager", "main",
             "data/WebVoyager_data.jsonl", "69b19fd86c23f1a500244a3724e039aa7ca6a1223d03e11eb10e308d4f11c488", False),
    TaskFile("webvoyager", "webvoyager/reference_answer.json", "MinorJerry/WebVoyager", "main",
             "data/reference_answer.json", "5473818408d8a19960c4f820c1e5721d218b87b547499d7281c2a0fc4267b0c4", False),
    TaskFile("webvoyager", "webvoyager/GAIA_web.jsonl", "MinorJerry/WebVoyager",
             "091544539eba485dbd74ef3742011ddeede37336", "data/GAIA_web.jsonl",
             "3b801188b17cb07d909dee66edffd1500759bc9faed107d6f3475a853b6fdbf3", True),
    TaskFile("webvoyager", "webvoyager/fara_WebVoyager_data_08312025.jsonl", "microsoft/fara", "main",
             "webeval/data/webvoyager/WebVoyager_data_08312025.jsonl",
             "5c8cb175fdac7a5ee7a2fa8d15de5dad96c617d86f2cb011853997ee23626b9f", False),
    TaskFile("webvoyager", "webvoyager/molmoweb_webvoyager.jsonl", "allenai/molmoweb", "main",
             "benchmarks/jsons/webvoyager.jsonl", "21f9cc4bed7286a25ead22eb7475d82d6845535dfcd77905c58ba87bb20f0b1c",
             False),
    TaskFile("online_mind2web", "online_mind2web/fara_Online_Mind2Web_06042025.json", "microsoft/fara", "main",
             "webeval/data/om2w/Online_Mind2Web_06042025.json",
             "e4bb090a72d8d57d300f358df906ffc0f6838750bc9e8112354e7a81a3c29c07", False),
    TaskFile("online_mind2web", "online_mind2web/molmoweb_online_mind2web.json", "allenai/molmoweb", "main",
             "benchmarks/jsons/online_mind2web.json",
             "50d330ee9f347c5ae136e52421516590033b146df305ab091c5a36b199b14aa4",
             False),
    TaskFile("online_mind2web", "online_mind2web/stagehand_onlineMind2Web.jsonl", "browserbase/stagehand",
             "06289148e4193d67371f07bd80a58e3268520260", "packages/evals/datasets/onlineMind2Web/onlineMind2Web.jsonl",
             "d10a837d6ea67349dca8541cd697eb2636ff61b937ba0f09596f775e1b327b30", True),
    # The commit was seen with a file of exactly these characters in the fork yawbtng/stagehand
    # (same fork network), not in browserbase/stagehand's own stored history: unconfirmed there.
    TaskFile("webtailbench", "webtailbench/stagehand_WebTailBench_data.jsonl", "browserbase/stagehand",
             "4e749b2a9fbd07b03c94053cda3a0420ed599b59", "packages/evals/datasets/webtailbench/WebTailBench_data.jsonl",
             "0a7911b59d2b09731e18efa2cd4f258da9db599b57cb0a389bdd736d0c07b590", False),
    TaskFile("webtailbench", "webtailbench/molmoweb_webtailbench.json", "allenai/molmoweb", "main",
             "benchmarks/jsons/webtailbench.json", "247d6fd0aec7b035c6ded953adfeb5474837ce63cd377a34f5610c6ec3c060fe",
             False),
)

# The file each live suite's collect run reads when collect.task_list is empty: the benchmark's
# own edition where we have it; Stagehand's WebTailBench carries the rubrics its judge needs.
DEFAULT_TASK_FILES = {
    "webvoyager": "webvoyager/WebVoyager_data.jsonl",
    "online_mind2web": "online_mind2web/fara_Online_Mind2Web_06042025.json",
    "webtailbench": "webtailbench/stagehand_WebTailBench_data.jsonl",
}


class ChecksumMismatch(RuntimeError):
    """A fetched file's sha256 is not the pinned one; nothing was written."""


class DownloadError(RuntimeError):
    """A file could not be fetched or written; the message names the URL or path."""


def default_data_dir() -> pathlib.Path:
    """Returns the folder task files are downloaded to and read from by default: $RMSWEB_DATA, else
    ~/.cache/rmsweb_jax/benchmarks."""
    env = os.environ.get("RMSWEB_DATA", "")
    return pathlib.Path(env).expanduser() if env else pathlib.Path.home() / ".cache" / "rmsweb_jax" / "benchmarks"


def default_task_file(suite: str) -> pathlib.Path:
    """Returns where the live `suite`'s default task file lies in the default data dir."""
    if suite not in DEFAULT_TASK_FILES:
        raise ValueError(f"suite {suite!r} has no downloadable task file; expected one of {list(DEFAULT_TASK_FILES)}")
    return default_data_dir() / DEFAULT_TASK_FILES[suite]


def download_command(suite: str) -> str:
    """Returns the shell command that downloads `suite`'s task files into the default data dir."""
    return f"python -m rmsweb_jax.suites.download --suite={suite}"


def files_of(suite: str) -> list[TaskFile]:
    """Returns the task files of `suite` ("all": every suite's)."""
    if suite == "all":
        return list(TASK_FILES)
    if suite not in SUITES:
        raise ValueError(f"--suite={suite!r}: expected one of {[*SUITES, 'all']}")
    return [f for f in TASK_FILES if f.suite == suite]


def url_of(file: TaskFile, base_url: str = GITHUB_RAW) -> str:
    """Returns the URL of `file`: <base_url>/<owner>/<repo>/<commit>/<path>."""
    return f"{base_url.rstrip('/')}/{file.repo}/{file.commit}/{file.path}"


def fetch(file: TaskFile, dest: str | pathlib.Path, base_url: str = GITHUB_RAW,
          timeout_s: float = TIMEOUT_S) -> pathlib.Path:
    """Returns dest/file.name after fetching it from `base_url` and checking its sha256; writes it
    atomically. Raises ChecksumMismatch (naming file, URL, expected and got sha256; nothing is
    written) or DownloadError."""
    target = pathlib.Path(dest) / file.name
    url = url_of(file, base_url)
    target.parent.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    tmp = tempfile.NamedTemporaryFile(dir=target.parent, prefix=f".{target.name}.", suffix=".part", delete=False)
    try:
        with tmp:
            for chunk in _chunks(file, url, timeout_s):
                digest.update(chunk)
                tmp.write(chunk)
            tmp.flush()
            os.fsync(tmp.fileno())
        got = digest.hexdigest()
        if got != file.sha256:
            raise ChecksumMismatch(f"{file.name}: the file at {url} has sha256 {got}, expected {file.sha256}; "
                                   "refusing it (nothing written). The upstream file changed or the mirror "
                                   "serves another version.")
        os.replace(tmp.name, target)
    except BaseException:
        pathlib.Path(tmp.name).unlink(missing_ok=True)
        raise
    fsync_dir(target.parent)  # make the rename itself durable
    return target


def _chunks(file: TaskFile, url: str, timeout_s: float) -> Iterator[bytes]:
    # Yields the response body; every way a GET can fail becomes a DownloadError naming the URL.
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            expected, received = response.headers.get("Content-Length"), 0
            for chunk in iter(lambda: response.read(1 << 16), b""):
                received += len(chunk)
                yield chunk
            # read(n) ends quietly when the server hangs up early: compare with the announced length.
            if expected is not None and expected.isdigit() and received != int(expected):
                raise DownloadError(f"{file.name}: GET {url} failed: the connection closed after {received} of "
                                    f"{expected} bytes")
    except urllib.error.HTTPError as e:
        raise DownloadError(f"{file.name}: GET {url} answered HTTP {e.code} {e.reason}") from None
    except (urllib.error.URLError, http.client.HTTPException, OSError) as e:
        # URLError: no connection; HTTPException (IncompleteRead, ...) or OSError: cut mid-body
        raise DownloadError(f"{file.name}: GET {url} failed: {getattr(e, 'reason', None) or repr(e)}") from None



def download(files: Iterable[TaskFile], dest: str | pathlib.Path, base_url: str = GITHUB_RAW,
             timeout_s: float = TIMEOUT_S, log: Callable[[str], None] = print) -> list[pathlib.Path]:
    """Returns the paths of `files` under `dest`, fetching each one not already there with its
    pinned sha256; logs each file's progress. Stops at the first failure (files already written stay)."""
    files = list(files)
    paths = []
    for i, file in enumerate(files, 1):
        target = pathlib.Path(dest) / file.name
        where = f"[{i}/{len(files)}] {file.name}"
        if target.is_file() and sha256_of(target) == file.sha256:
            log(f"{where}: already present, sha256 ok")
        else:
            log(f"{where}: fetching {url_of(file, base_url)}")
            fetch(file, dest, base_url, timeout_s)
            log(f"{where}: {target.stat().st_size} bytes, sha256 ok")
        paths.append(target)
    return paths


def main(argv: list[str] | None = None) -> int:
    """Runs the command line; returns the exit status (0: every file present with its sha256)."""
    parser = argparse.ArgumentParser(prog="python -m rmsweb_jax.suites.download",
                                     description="Download the live benchmarks' task files at pinned commits.")
    parser.add_argument("--suite", required=True, choices=[*SUITES, "all"])
    parser.add_argument("--dest", default=None, help=f"data dir (default: $RMSWEB_DATA or {default_data_dir()})")
    parser.add_argument("--base_url", default=os.environ.get("RMSWEB_BENCHMARKS_URL") or GITHUB_RAW,
                        help="replaces https://raw.githubusercontent.com (default: $RMSWEB_BENCHMARKS_URL)")
    parser.add_argument("--timeout_s", type=float, default=TIMEOUT_S, help="per-request timeout (seconds)")
    args = parser.parse_args(argv)
    dest = pathlib.Path(args.dest).expanduser() if args.dest else default_data_dir()
    try:
        download(files_of(args.suite), dest, args.base_url, args.timeout_s)
    except (ChecksumMismatch, DownloadError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"{args.suite}: task files in {dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
