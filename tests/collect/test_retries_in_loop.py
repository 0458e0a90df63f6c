"""The collector's blocking entry points (RetryCollector.run / run_pairs) called from a thread that
already runs an event loop, as every Jupyter/Colab cell is: they complete on MiniWoB++ in real
Chromium (asyncio.run() refuses a running loop), hand a policy's error back to the caller, and
leave the caller's loop usable."""
import asyncio
import threading

import pytest

from rmsweb_jax.agents.teacher import MistakeConfig, ScriptedTeacher
from rmsweb_jax.collect.retries import RetryCollector
from rmsweb_jax.collect.store import TrajectoryStore
from rmsweb_jax.judges.programmatic import ProgrammaticJudge
from rmsweb_jax.suites.miniwob import MiniWoBSuite, load_miniwob_tasks
from tests.collect.wrapped_policy import WrappedPolicy
from tests.settings import collect_settings, store_writer

pytestmark = pytest.mark.browser

TASKS = ("miniwob.click-button", "miniwob.click-link")
NO_MISTAKES = MistakeConfig(wrong_element_p=0.0, detour_p=0.0, early_stop_p=0.0, seed=0)


class RecordsThreads(WrappedPolicy):
    """The teacher, recording the thread of every act() call."""

    def __init__(self, inner):
        super().__init__(inner)
        self.threads = set()

    def act(self, contexts):
        self.threads.add(threading.get_ident())
        return self.inner.act(contexts)


class FailsFirst(WrappedPolicy):
    """The teacher, except that its first act() raises."""

    def act(self, contexts):
        raise ConnectionError("policy endpoint went away")


def _collector(suite, policy, store):
    return RetryCollector(suite, policy, ProgrammaticJudge(success="solved"), store,
                          collect_settings(attempts=2, workers=1,
                          max_steps=6, progress=False))


def test_run_and_run_pairs_complete_inside_a_running_loop(tmp_path):
    known = {t.id: t for t in load_miniwob_tasks()}
    tasks = [known[name] for name in TASKS]
    policy = RecordsThreads(ScriptedTeacher(NO_MISTAKES, tasks=TASKS))

    async def cell():
        """A notebook cell: the kernel's loop runs in this thread while the cell calls blocking code."""
        caller_loop = asyncio.get_running_loop()
        with MiniWoBSuite() as suite, store_writer(tmp_path / "store") as store:
            collector = _collector(suite, policy, store)
            summary = collector.run(tasks[:1], [0])
            pairs = collector.run_pairs([(tasks[1], 0), (tasks[0], 0)])
        # The caller's loop is still its own and still runs coroutines.
        assert asyncio.get_running_loop() is caller_loop and await asyncio.sleep(0, "alive") == "alive"
        return summary, pairs

    summary, pairs = asyncio.run(cell())
    assert summary.collected == 1 and summary.solved == 1
    assert pairs.collected == 1 and pairs.skipped == 1 and pairs.solved == 1
    groups = TrajectoryStore(tmp_path / "store").groups()
    assert sorted(groups) == [("miniwob.click-button", 0), ("miniwob.click-link", 0)]
    assert all(attempts[-1].success for attempts in groups.values())
    assert threading.get_ident() not in policy.threads  # the episodes ran on a loop of their own


def test_a_policy_error_inside_a_running_loop_reaches_the_caller(tmp_path):
    task = {t.id: t for t in load_miniwob_tasks()}["miniwob.click-button"]

    async def cell():
        with MiniWoBSuite() as suite, store_writer(tmp_path / "store") as store:
            _collector(suite, FailsFirst(ScriptedTeacher(NO_MISTAKES)), store).run([task], [0])

    with pytest.raises(ConnectionError, match="policy endpoint went away"):
        asyncio.run(cell())
    assert TrajectoryStore(tmp_path / "store").groups() == {}
