"""Recording an episode's traffic, storage and clock once, and replaying the episode offline from it.

Mode "record" gives each episode a fresh context that Playwright records as a HAR with every body
embedded (record_har_path, content "embed": one self-contained file to hash and copy); the page
clock is fixed (Playwright's clock API, `set_fixed_time`) at the wall time the episode started, so
`Date.now()` and `new Date()` read that instant for the whole episode; cookies and local storage
are saved at the start and at the end (`storage_state`) in `<name>.state.json` beside the HAR.

Mode "replay" serves every request of the episode's context from its HAR (`route_from_har`,
not_found "abort": nothing reaches the network), starts the context with the recorded storage and
fixes the clock at the recorded instant. A request the HAR does not hold is aborted; the first such
URL makes the episode `off_record` (a policy that acted otherwise than the recorded one): it is
reported apart, neither a success nor a failure of the policy.

What replay cannot reproduce: randomness the clock does not fix (`Math.random`, `crypto`), timing
(`performance.now()`, animations, the order in which responses arrive), WebSocket and WebRTC traffic
(the HAR holds HTTP only), and server state a POST changed (the HAR answers each request as it was
answered once). A page that asks for something different because of these is off_record with its URL.

A suite that serves its own pages (MiniWoB++) does so on a new port each run: the recording keeps the
suite's origin, and a replay under another origin serves the HAR with the old origin replaced by the new
one (a temporary copy, removed when the episode ends; the recording and its sha256 stay as recorded, and a
read-only store replays too).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import pathlib
import re
import tempfile
import time
from typing import Any

RECORD, REPLAY = "record", "replay"
TAPE_MODES = (RECORD, REPLAY)
# What Chromium reports for a request route_from_har aborted (not_found="abort"); the guard's own
# refusals read net::ERR_BLOCKED_BY_CLIENT, a cancelled navigation net::ERR_ABORTED.
_ABORTED_BY_REPLAY = "net::ERR_FAILED"
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


class DamagedRecording(RuntimeError):
    """A recording that cannot be replayed: missing, not a HAR, or other bytes than recorded."""


@dataclasses.dataclass(frozen=True)
class Tape:
    """Where a worker records its episodes (mode RECORD) or replays them from (mode REPLAY)."""

    mode: str
    directory: str

    def __post_init__(self):
        if self.mode not in TAPE_MODES:
            raise ValueError(f"Tape.mode {self.mode!r}: expected one of {list(TAPE_MODES)}")


@dataclasses.dataclass(frozen=True)
class Recording:
    """One recorded episode's files (names inside the tape's directory), the HAR's sha256 and size,
    and the instant (ms since the epoch) the page clock was fixed at."""

    har: str
    state: str
    sha256: str
    bytes: int
    started_ms: float

    def to_dict(self) -> dict[str, Any]:
        """Returns a JSON-ready dict."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Recording":
        """Returns the Recording stored by `to_dict`."""
        return cls(**d)


def tape_name(request_id: str) -> str:
    """Returns the file stem of `request_id`'s recording: readable, and unique through a hash (two ids
    that differ only in characters a file name cannot hold do not collide)."""
    digest = hashlib.sha256(request_id.encode()).hexdigest()[:10]
    return f"{_UNSAFE.sub('_', request_id)[:80]}-{digest}"


def file_sha256(path: pathlib.Path) -> str:
    """Returns the hex sha256 of the file at `path`."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def check_recording(directory: str | pathlib.Path, recording: Recording) -> None:
    """Raises DamagedRecording naming the file when the HAR or state file is missing, the HAR's
    bytes differ from the recorded sha256, or the HAR is not a HAR."""
    directory = pathlib.Path(directory)
    har, state = directory / recording.har, directory / recording.state
    for path in (har, state):
        if not path.is_file():
            raise DamagedRecording(f"recording {path} is missing")
    size, digest = har.stat().st_size, file_sha256(har)
    if size != recording.bytes or digest != recording.sha256:
        raise DamagedRecording(f"recording {har} is damaged: {size} bytes with sha256 {digest[:16]}..., recorded "
                               f"{recording.bytes} bytes with sha256 {recording.sha256[:16]}...")
    read_har(har)


def read_har(path: pathlib.Path) -> dict[str, Any]:
    """Returns the HAR at `path`; raises DamagedRecording naming it when it is not one."""
    try:
        har = json.loads(path.read_bytes())
        entries = har["log"]["entries"]
        if not isinstance(entries, list):
            raise TypeError(f"log.entries is a {type(entries).__name__}")
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise DamagedRecording(f"recording {path} is not a readable HAR ({type(e).__name__}: {e}); expected the "
                               "JSON file Playwright's record_har_path wrote") from None
    return har


class TapeSession:
    """One episode's recording or replay on a fresh context (the worker's side of a Tape).

        session = TapeSession(tape, request_id)
        context = await browser.new_context(**options, **session.context_options())
        await session.attach(context)          # clock, replay routes
        ...                                    # the episode
        await session.finish(context)          # closes the context; returns the Recording (record)
    """

    def __init__(self, tape: Tape, request_id: str, suite_origin: str | None = None):
        self.tape = tape
        self.suite_origin = suite_origin  # where the suite serves its own pages this run (None: it serves none)
        self.directory = pathlib.Path(tape.directory)
        self.name = tape_name(request_id)
        self.har = self.directory / f"{self.name}.har"
        self.state_path = self.directory / f"{self.name}.state.json"
        self.off_record: str | None = None  # the first request the recording did not hold (replay)
        self._moved: pathlib.Path | None = None  # the HAR under this run's suite origin (replay), removed at the end
        if tape.mode == REPLAY:
            if not self.har.is_file() or not self.state_path.is_file():
                raise DamagedRecording(f"no recording of episode {request_id!r} in {self.directory} "
                                       f"({self.har.name} or {self.state_path.name} missing)")
            read_har(self.har)
            state = json.loads(self.state_path.read_text())
            self.started_ms, self.storage_start = state["started_ms"], state["storage_start"]
            recorded_origin = state["suite_origin"]
            if recorded_origin and suite_origin and recorded_origin != suite_origin:
                fd, moved = tempfile.mkstemp(prefix=f"{self.name}-", suffix=".har")
                with os.fdopen(fd, "w") as f:
                    f.write(self.har.read_text().replace(_netloc(recorded_origin), _netloc(suite_origin)))
                self.har = self._moved = pathlib.Path(moved)
        else:
            self.directory.mkdir(parents=True, exist_ok=True)
            self.started_ms, self.storage_start = round(time.time() * 1000), None

    def context_options(self) -> dict[str, Any]:
        """Returns the new_context options of this episode's context."""
        if self.tape.mode == RECORD:
            return {"record_har_path": str(self.har), "record_har_content": "embed", "record_har_mode": "full"}
        return {"storage_state": self.storage_start}

    async def attach(self, context) -> None:
        """Fixes `context`'s clock at the episode's instant; in replay, routes every request to the HAR."""
        await context.clock.set_fixed_time(self.started_ms / 1000)
        if self.tape.mode == REPLAY:
            await context.route_from_har(self.har, not_found="abort")
            context.on("requestfailed", self._on_failed)
        else:
            self.storage_start = await context.storage_state()

    def _on_failed(self, request) -> None:
        if self.off_record is None and request.failure == _ABORTED_BY_REPLAY:
            self.off_record = request.url

    async def finish(self, context) -> Recording | None:
        """Closes `context` (Playwright writes the HAR then); in record mode saves the storage and the
        clock's instant and returns the Recording, in replay returns None."""
        if self.tape.mode == RECORD:
            storage_end = await context.storage_state()
        else:  # requests still routed would answer into a closed context
            storage_end = await context.unroute_all(behavior="ignoreErrors")
        await context.close()
        if self.tape.mode == REPLAY:
            if self._moved is not None:
                self._moved.unlink(missing_ok=True)
            return None
        self.state_path.write_text(json.dumps({"started_ms": self.started_ms, "storage_start": self.storage_start,
                                               "storage_end": storage_end, "suite_origin": self.suite_origin}))
        return Recording(har=self.har.name, state=self.state_path.name, sha256=file_sha256(self.har),
                         bytes=self.har.stat().st_size, started_ms=self.started_ms)


def _netloc(origin: str) -> str:
    return origin.split("://", 1)[-1].rstrip("/")
