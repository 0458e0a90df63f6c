"""One run per workdir: the lock a run takes before it writes anything and holds until it ends.

    with WorkdirLock.acquire(workdir, force=config.force_unlock) as lock:   # UserError when another run holds it
        run_stages(config, workdir)

The lock is <workdir>/run.lock, a JSON holder record: {"host", "pid", "started", "renewed", "lease_s", "token"}
(times as UTC ISO 8601 strings to the millisecond; `token` tells one holder from the next on the same host and pid).

Why these rules:
- Local workdir: fcntl.flock on run.lock, held for the whole run. The kernel drops the lock when its holder
  dies (SIGKILL, OOM, a crash), so a dead run's lock is taken over by the next run with no judgement about
  pids or clocks, and of two contenders for it exactly one wins (flock is one atomic test-and-set). The holder
  record is written into the same file once the lock is held, for the refusal message. A lock file is never
  deleted by a normal run (a contender may hold it open); --config.force_unlock unlinks it and locks a new one,
  and the acquirer checks that the file it locked is still the one at the path.
- gs:// workdir: GCS has no flock, so run.lock is a lease object. It is created with ifGenerationMatch=0 (of
  two creators one gets 412), renewed every RENEW_S by a daemon thread with ifGenerationMatch=<the generation
  it last wrote>, and taken over once `renewed + lease_s` has passed by a write conditioned on the generation
  that was read (of two contenders one gets 412). A holder whose renewal fails with 412 has lost the lock: it
  says so and interrupts its main thread rather than keep writing beside the new holder.
- Lease times are module constants (tests set short ones): LEASE_S is long against RENEW_S so that a slow
  request or two does not lose a live run's lock, and short enough that a preempted run's workdir is free
  within minutes.
- Multi-host runs: process 0 holds the lock (rmsweb_jax/main.py); the other processes wait for its answer.
"""
from __future__ import annotations

import datetime
import fcntl
import json
import os
import pathlib
import socket
import sys
import threading
import time
import _thread
import uuid
from urllib.parse import quote

from etils import epath

from rmsweb_jax import storage
from rmsweb_jax.errors import UserError

LOCK_NAME = "run.lock"
LEASE_S = 120.0  # a gs:// lease not renewed for this long is free to take over
RECORD_WAIT_S = 2.0  # how long a refused run waits for a holder that has just taken the lock to write its record
RENEW_S = 30.0   # how often a live run renews its gs:// lease


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


def _iso(t: datetime.datetime) -> str:
    return t.isoformat(timespec="milliseconds")


def describe(record: dict | None) -> str:
    """Returns the holder of a lock record in words: 'the run started <time> on host <h>, pid <p>'."""
    if not record:
        return "a run that is still writing its holder record"
    return f"the run started {record.get('started', '?')} on host {record.get('host', '?')}, pid {record.get('pid', '?')}"


class WorkdirLock:
    """The lock on one workdir, held by this process until release() (or its death)."""

    def __init__(self, workdir, record: dict, displaced: dict | None):
        self.workdir = storage.as_path(workdir)
        self.path = self.workdir / LOCK_NAME
        self.record = record
        self.displaced = displaced  # the holder that force_unlock pushed aside, or None

    @staticmethod
    def acquire(workdir, *, force: bool = False, lease_s: float | None = None,
                renew_s: float | None = None) -> "WorkdirLock":
        """Returns the held lock of `workdir`; UserError naming the holder when another live run holds it.
        `force`: take it anyway (config.force_unlock), the displaced holder then in `.displaced`."""
        workdir = storage.as_path(workdir)  # another URL scheme: UserError before anything is written
        lease_s = LEASE_S if lease_s is None else lease_s
        renew_s = RENEW_S if renew_s is None else renew_s
        record = {"host": socket.gethostname(), "pid": os.getpid(), "started": _iso(_now()),
                  "renewed": _iso(_now()), "lease_s": lease_s, "token": uuid.uuid4().hex}
        if storage.is_remote(workdir):
            return _LeaseLock.take(workdir, record, force=force, renew_s=renew_s)
        return _FlockLock.take(workdir, record, force=force)

    def release(self) -> None:
        """Gives the lock up (idempotent)."""

    def __enter__(self) -> "WorkdirLock":
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def refusal(workdir, path, holder: dict | None) -> UserError:
    """Returns the one-line error of a run refused because `holder` holds the lock at `path`."""
    frees = (f"a gs:// lease expires {holder.get('lease_s', LEASE_S) if holder else LEASE_S:.0f} s after its last "
             "renewal" if storage.is_remote(workdir) else "a local lock is freed when its run dies")
    return UserError(f"workdir {workdir} is in use by {describe(holder)} (lock {path}); wait for that run to end "
                     f"or use another --workdir; if that run is gone and its lock stays ({frees}), rerun with "
                     "--config.force_unlock=true")


class _FlockLock(WorkdirLock):
    """A local workdir's lock: flock on <workdir>/run.lock, the holder record inside it."""

    def __init__(self, workdir, record, displaced, fd: int):
        super().__init__(workdir, record, displaced)
        self._fd: int | None = fd

    @classmethod
    def take(cls, workdir, record: dict, *, force: bool) -> "_FlockLock":
        workdir = pathlib.Path(workdir)
        workdir.mkdir(parents=True, exist_ok=True)
        path = workdir / LOCK_NAME
        displaced = None
        while True:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _wait_for_record(fd)
                os.close(fd)
                if not force:
                    raise refusal(workdir, path, holder) from None
                displaced = holder or {}
                path.unlink(missing_ok=True)  # its holder keeps the old file; the next loop locks a new one
                force = False
                continue
            if _same_file(fd, path):
                break
            os.close(fd)  # force_unlock replaced the file between our open and our flock: lock the new one
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(record).encode(), 0)
        os.fsync(fd)
        return cls(workdir, record, displaced, fd)

    def release(self) -> None:
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        if _same_file(fd, self.path):
            os.ftruncate(fd, 0)  # a record left behind would name a run that has ended
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def _same_file(fd: int, path: pathlib.Path) -> bool:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    own = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (own.st_dev, own.st_ino)


def _read_record(fd: int) -> dict | None:
    """Returns the holder record in the lock file `fd`, or None while its holder has not written it yet."""
    data = os.pread(fd, 1 << 16, 0)
    try:
        return json.loads(data) if data.strip() else None
    except json.JSONDecodeError:
        return None


def _wait_for_record(fd: int) -> dict | None:
    """Returns the holder record in the lock file `fd`, waiting up to RECORD_WAIT_S for it: a holder writes it just
    after its flock, so a contender that lost the race by microseconds can still name the run that won."""
    deadline = time.monotonic() + RECORD_WAIT_S
    while (record := _read_record(fd)) is None and time.monotonic() < deadline:
        time.sleep(0.01)
    return record


class _LeaseLock(WorkdirLock):
    """A gs:// workdir's lock: a lease object renewed with generation preconditions."""

    def __init__(self, workdir, record, displaced, generation: int, renew_s: float):
        super().__init__(workdir, record, displaced)
        self._generation = generation
        self._stop = threading.Event()
        self._guard = threading.Lock()
        self.lost = False
        self._thread = threading.Thread(target=self._renew_loop, args=(renew_s,), name="workdir-lease",
                                        daemon=True)
        self._thread.start()

    @classmethod
    def take(cls, workdir, record: dict, *, force: bool, renew_s: float) -> "_LeaseLock":
        path = storage.as_path(workdir) / LOCK_NAME
        displaced = None
        try:
            generation = put_object(path, record, if_generation=0)
        except FileExistsError:
            holder, generation = get_object(path)
            if holder is not None and not force and not _expired(holder):
                raise refusal(workdir, path, holder) from None
            displaced = (holder or {}) if force else None
            try:
                # a lock deleted since our read has generation 0 again: the precondition still holds exactly
                generation = put_object(path, record, if_generation=generation)
            except FileExistsError:
                raise refusal(workdir, path, get_object(path)[0]) from None  # another contender won
        return cls(workdir, record, displaced, generation, renew_s)

    def _renew_loop(self, renew_s: float) -> None:
        while not self._stop.wait(renew_s):
            with self._guard:
                if self._stop.is_set():
                    return
                self.record = dict(self.record, renewed=_iso(_now()))
                try:
                    self._generation = put_object(self.path, self.record, if_generation=self._generation)
                except FileExistsError:
                    self.lost = True
                    print(f"rmsweb: error: lost the lock of workdir {self.workdir} to "
                          f"{describe(get_object(self.path)[0])}; stopping so that two runs never write there",
                          file=sys.stderr, flush=True)
                    _thread.interrupt_main()
                    return
                except OSError as err:  # a failed request: the lease still runs; the next renewal retries
                    print(f"rmsweb: warning: renewing the lock {self.path} failed ({err}); retrying in "
                          f"{renew_s:.0f} s", file=sys.stderr, flush=True)

    def release(self) -> None:
        with self._guard:
            if self._stop.is_set():
                return
            self._stop.set()
        self._thread.join(timeout=60)
        if not self.lost:
            delete_object(self.path, if_generation=self._generation)


def _expired(record: dict) -> bool:
    """Returns whether the lease `record` has run out (a record we cannot read counts as run out)."""
    try:
        renewed = datetime.datetime.fromisoformat(record["renewed"])
        return (_now() - renewed).total_seconds() > float(record["lease_s"])
    except (KeyError, TypeError, ValueError):
        return True


def _api(path) -> tuple:
    """Returns (the gcsfs file system, its endpoint, bucket, object name) of bucket object `path`."""
    fs = epath.backend.fsspec_backend.fs(str(path))
    bucket, _, name = str(path)[len(storage.SCHEME):].partition("/")
    return fs, fs._location, bucket, name


def put_object(path, record: dict, *, if_generation: int) -> int:
    """Returns the generation of bucket object `path` after writing `record` (JSON) to it, provided its generation
    is `if_generation` (0: it does not exist); FileExistsError (HTTP 412) otherwise."""
    fs, endpoint, bucket, name = _api(path)
    meta = json.dumps({"name": name, "contentType": "application/json"})
    # multipart, not media: the emulator (and the JSON API) honour ifGenerationMatch on it
    body = (f"--==0==\nContent-Type: application/json; charset=UTF-8\n\n{meta}\n--==0==\n"
            "Content-Type: application/json\n\n").encode() + json.dumps(record).encode() + b"\n--==0==--"
    reply = fs.call("POST", f"{endpoint}/upload/storage/v1/b/{quote(bucket)}/o", uploadType="multipart",
                    headers={"Content-Type": 'multipart/related; boundary="==0=="'}, data=body, json_out=True,
                    ifGenerationMatch=str(if_generation))
    return int(reply["generation"])


def get_object(path) -> tuple[dict | None, int]:
    """Returns (the JSON record in bucket object `path`, its generation), or (None, 0) when it does not exist."""
    fs, endpoint, bucket, name = _api(path)
    try:
        headers, data = fs.call("GET", f"{endpoint}/storage/v1/b/{quote(bucket)}/o/{quote(name, safe='')}",
                                alt="media")
    except FileNotFoundError:
        return None, 0
    generation = int(headers.get("x-goog-generation") or headers.get("X-Goog-Generation"))
    try:
        return json.loads(data), generation
    except json.JSONDecodeError:
        return {}, generation


def delete_object(path, *, if_generation: int) -> None:
    """Deletes bucket object `path` if its generation is still `if_generation` (a lock taken over stays)."""
    fs, endpoint, bucket, name = _api(path)
    try:
        fs.call("DELETE", f"{endpoint}/storage/v1/b/{quote(bucket)}/o/{quote(name, safe='')}",
                ifGenerationMatch=str(if_generation))
    except (FileNotFoundError, FileExistsError):
        pass  # gone, or another run's lock now: not ours to delete
