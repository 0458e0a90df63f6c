"""Fixtures for suite tests: the MiniWoB++ task list, suite (HTTP server) and a worker."""
import pytest

from rmsweb_jax.suites.miniwob import MiniWoBSuite, load_miniwob_tasks
from rmsweb_jax.web.worker import BrowserWorker


@pytest.fixture(scope="session")
def miniwob_tasks():
    """Returns {task id: Task} for the 125 tasks of the packaged table (rmsweb_jax/suites/miniwob_tasks.csv)."""
    return {t.id: t for t in load_miniwob_tasks()}


@pytest.fixture(scope="session")
def miniwob_suite():
    """A MiniWoBSuite serving the installed package's html/ folder."""
    with MiniWoBSuite() as suite:
        yield suite


@pytest.fixture(scope="module")
def miniwob_worker(loop, miniwob_suite):
    """A started BrowserWorker on the MiniWoB suite."""
    worker = BrowserWorker(miniwob_suite)
    loop.run(worker.start(), 120)
    yield worker
    loop.run(worker.close(), 60)
