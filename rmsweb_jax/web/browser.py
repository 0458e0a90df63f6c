"""Launching Debian's Chromium under Playwright, and finding and killing what we launched.

Every browser carries a marker switch (`--rmsweb-marker=<id>`) on its command line so a pool
can find its own processes in /proc and kill them even when Playwright cannot (a hung or
orphaned browser, Ctrl-C during shutdown). Chromium ignores switches it does not know.
"""
from __future__ import annotations

import asyncio
import os
import pathlib
import shutil
import signal
import sys
import time
import uuid

from playwright.async_api import Error as PlaywrightError
from playwright.async_api import TimeoutError as PlaywrightTimeoutError

CHROMIUM_CANDIDATES = ("/usr/lib/chromium/chromium", "/usr/bin/chromium", "/usr/bin/chromium-browser")
CHROMIUM_FLAGS = (
    "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
    "--disable-component-update", "--disable-sync",
)
MARKER_FLAG = "--rmsweb-marker="


class ChromiumNotFound(RuntimeError):
    """No Chromium binary at the configured path or any of CHROMIUM_CANDIDATES."""


class LaunchTimeout(RuntimeError):
    """Chromium did not start within the launch timeout, however often it was tried."""


def find_chromium(path: str | None = None) -> str:
    """Returns the Chromium binary to launch: `path`, $RMSWEB_CHROMIUM, or the first of
    CHROMIUM_CANDIDATES that exists (the real binary before Debian's shell wrapper, which starts
    slower). Never a Playwright-downloaded browser."""
    for candidate in (path, os.environ.get("RMSWEB_CHROMIUM"), *CHROMIUM_CANDIDATES, shutil.which("chromium")):
        if candidate and os.access(candidate, os.X_OK) and pathlib.Path(candidate).is_file():
            return candidate
    raise ChromiumNotFound(
        f"no Chromium binary found (tried {path!r}, $RMSWEB_CHROMIUM, {list(CHROMIUM_CANDIDATES)}); "
        "install Debian's chromium package (apt-get install chromium)")


def new_marker() -> str:
    """Returns a fresh marker id for one pool or worker."""
    return uuid.uuid4().hex[:16]


async def launch_chromium(playwright, marker: str, *, executable: str | None = None, headless: bool = True,
                          extra_args: tuple[str, ...] = (), timeout_s: float = 30.0, attempts: int = 3):
    """Returns a Playwright Browser running Debian's Chromium with our flags and `marker`.

    A launch that does not answer within `timeout_s` (Chromium now and then hangs at start-up on a
    loaded machine) is killed by its marker and tried again, up to `attempts` launches in all; the
    last attempt's error is raised, naming how many were made."""
    if attempts < 1:
        raise ValueError(f"attempts = {attempts}: at least one launch is needed")
    binary = find_chromium(executable)
    for attempt in range(1, attempts + 1):
        try:
            return await playwright.chromium.launch(
                executable_path=binary, headless=headless,
                args=[*CHROMIUM_FLAGS, *extra_args, MARKER_FLAG + marker], timeout=timeout_s * 1000,
                # Playwright's own SIGINT/SIGTERM handlers would close browsers behind our back;
                # the pool closes them itself (and kills leftovers by marker).
                handle_sigint=False, handle_sigterm=False, handle_sighup=False,
            )
        except PlaywrightTimeoutError as e:
            kill_marked(marker, exact=True)  # the hung browser, so the next attempt starts clean
            if attempt == attempts:
                raise LaunchTimeout(f"Chromium ({binary}) did not start within {timeout_s:g} s in {attempts} "
                                    f"attempts: {str(e).splitlines()[0]}") from e
            print(f"[browser] Chromium launch {attempt}/{attempts} timed out after {timeout_s:g} s; killed it "
                  "and launching again", file=sys.stderr, flush=True)


class EndpointDown(RuntimeError):
    """A remote Chromium (a CDP endpoint) did not answer however often it was tried."""


async def connect_chromium(playwright, endpoint: str, *, timeout_s: float, attempts: int, backoff_s: float = 0.5):
    """Returns a Playwright Browser driving the remote Chromium at `endpoint` over CDP (connect_over_cdp:
    ws://host:port/devtools/browser/<id>, or http://host:port, which asks the browser for its current ws URL
    and so finds a browser restarted on the same port).

    A connection that fails or does not answer within `timeout_s` is tried again after a backoff that
    doubles from `backoff_s`, up to `attempts` tries; then EndpointDown names the address."""
    if attempts < 1:
        raise ValueError(f"attempts = {attempts}: at least one connection attempt is needed")
    delay = backoff_s
    for attempt in range(1, attempts + 1):
        try:
            return await playwright.chromium.connect_over_cdp(endpoint, timeout=timeout_s * 1000)
        except PlaywrightError as e:
            if attempt == attempts:
                raise EndpointDown(f"the remote Chromium at {endpoint} did not answer in {attempts} attempts "
                                   f"({timeout_s:g} s each, backoff from {backoff_s:g} s): "
                                   f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from e
            print(f"[browser] connecting to {endpoint} failed ({attempt}/{attempts}); again in {delay:g} s",
                  file=sys.stderr, flush=True)
            await asyncio.sleep(delay)  # backoff: the remote browser may be restarting
            delay *= 2


def marked_pids(marker: str, exact: bool = False) -> list[int]:
    """Returns the pids of live browser processes whose command line carries `marker`; unless
    `exact`, a prefix matches, so a pool's marker finds all of its workers' browsers.

    A process forked by a marked browser carries its command line until it execs (Chromium forks
    its zygote and helpers): one whose parent is marked too is that browser's, not another one.
    """
    needle = (MARKER_FLAG + marker).encode()
    parents = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                args = f.read().split(b"\0")
            with open(f"/proc/{entry}/stat", "rb") as f:
                state, ppid = f.read().rsplit(b")", 1)[1].split()[:2]
        except (OSError, ValueError):
            continue
        if state != b"Z" and any(arg == needle if exact else arg.startswith(needle) for arg in args):
            parents[int(entry)] = int(ppid)
    return sorted(pid for pid, ppid in parents.items() if ppid not in parents)


def kill_marked(marker: str, exact: bool = False, wait_s: float = 5.0) -> list[int]:
    """Kills (SIGKILL) the process group of every browser carrying `marker`, waits up to `wait_s`
    until none is left alive, and returns their pids.

    Playwright starts each browser as a process-group leader, so the group holds its zygote,
    renderers and utility processes. A killed process stays in /proc, not yet a zombie, until the
    kernel has torn it down (longer on a loaded machine), and a child forked in that moment shows up
    as a browser of its own once its parent is gone: both are looked for again, and killed, until
    nothing carrying the marker is left or `wait_s` has passed.
    """
    killed: list[int] = []
    deadline = time.monotonic() + wait_s
    while True:
        pids = marked_pids(marker, exact)
        if not pids:
            return killed
        for pid in pids:
            for kill in (lambda: os.killpg(pid, signal.SIGKILL), lambda: os.kill(pid, signal.SIGKILL)):
                try:
                    kill()
                    break
                except (ProcessLookupError, PermissionError):
                    continue
        killed.extend(pid for pid in pids if pid not in killed)
        if time.monotonic() >= deadline:
            return killed
        time.sleep(0.02)


async def close_browser(browser, marker: str, timeout_s: float = 5.0) -> None:
    """Closes `browser` politely within `timeout_s`, then kills whatever carries `marker`."""
    if browser is not None:
        try:
            await asyncio.wait_for(browser.close(), timeout_s)
        except Exception:  # noqa: BLE001 — a dead or hung browser: the kill below handles it
            pass
    kill_marked(marker, exact=True)
