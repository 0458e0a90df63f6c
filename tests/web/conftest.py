"""Fixtures for browser tests: a local HTTP server for the test pages, a loop thread, a worker."""
import pathlib

import pytest

from rmsweb_jax.suites.http_server import LocalHTTPServer
from rmsweb_jax.suites.live import LiveSuite
from rmsweb_jax.suites.task import Task
from rmsweb_jax.web.worker import BrowserWorker, WorkerConfig

PAGES = pathlib.Path(__file__).parent / "pages"


@pytest.fixture(scope="session")
def page_server():
    """Serves tests/web/pages on 127.0.0.1."""
    with LocalHTTPServer(PAGES) as server:
        yield server


@pytest.fixture(scope="session")
def page_task(page_server):
    """Returns a factory: page file name -> Task starting there, allowlisted to the server."""
    def make(name: str) -> Task:
        return Task(suite="test", id=name, start_url=page_server.url(name), instruction=f"test page {name}",
                    allowed_hosts=(page_server.netloc,))
    return make


@pytest.fixture(scope="module")
def live_worker(loop):
    """A started BrowserWorker on a LiveSuite (640x480, fresh context per episode)."""
    worker = BrowserWorker(LiveSuite(viewport=(640, 480), settle_s=0.1), WorkerConfig(step_timeout_s=10))
    loop.run(worker.start(), 120)
    yield worker
    loop.run(worker.close(), 60)
