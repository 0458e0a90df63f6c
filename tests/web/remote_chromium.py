"""A Chromium the test starts with --remote-debugging-port on 127.0.0.1: a remote browser for the CDP tests."""
import json
import os
import signal
import socket
import subprocess
import time
import urllib.request

from rmsweb_jax.web.browser import CHROMIUM_FLAGS, find_chromium

START_S = 30.0  # upper bound on a Chromium's start-up: only reached when it is broken


class RemoteChromium:
    """A headless Chromium listening for CDP on 127.0.0.1:`port`, in its own process group."""

    def __init__(self, port: int, profile):
        self.port, self.profile, self.process = port, profile, None

    def start(self) -> None:
        self.process = subprocess.Popen(
            [find_chromium(), "--headless", *CHROMIUM_FLAGS, f"--remote-debugging-port={self.port}",
             "--remote-debugging-address=127.0.0.1", f"--user-data-dir={self.profile}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + START_S
        while True:  # the endpoint answers once the browser listens
            try:
                with urllib.request.urlopen(f"{self.http}/json/version", timeout=2) as r:
                    json.load(r)
                return
            except OSError:
                assert self.process.poll() is None, "the remote Chromium exited during start-up"
                assert time.monotonic() < deadline, f"no CDP endpoint on port {self.port} within {START_S:g} s"
                time.sleep(0.1)

    @property
    def http(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def kill(self) -> None:
        """SIGKILLs the browser's process group (again: a no-op)."""
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:  # killed before
            pass
        self.process.wait(timeout=10)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
