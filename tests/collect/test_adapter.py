"""PolicyBridge: concurrent pool calls become one batched act(); contexts carry the episode so far
and the attempt's reflections; an unparseable turn runs as a harmless wait and is recorded."""
import asyncio
import dataclasses
import threading

import pytest

from rmsweb_jax.agents.policy import PolicyOutput, ReflectionRequest
from rmsweb_jax.agents.teacher import ScriptedTeacher
from rmsweb_jax.collect.adapter import AttemptSpec, PolicyBridge, split_turn
from rmsweb_jax.suites.task import Task
from rmsweb_jax.web.action_text import format_action
from rmsweb_jax.web.actions import Action
from rmsweb_jax.web.episode import EpisodeRequest, History
from rmsweb_jax.collect.store_fixture import click_step as step
from tests.collect.wrapped_policy import WrappedPolicy

# Upper bound on any wait in this file: only reached when the behaviour under test is broken.
WAIT_S = 60.0
TASK = Task(suite="miniwob", id="miniwob.click-button", start_url="miniwob/click-button.html")


def observation(label: str):
    return dataclasses.replace(step(TASK.id, 0, 1, 0, label=label).observation(),
                               instruction='Click on the "Submit" button.')


def history(rid: str, steps: int = 0) -> History:
    obs = tuple(observation(f"{rid}/{i}") for i in range(steps + 1))
    actions = tuple(Action.click(100 + i, 100) for i in range(steps))
    return History(request=EpisodeRequest(TASK, seed=0, max_steps=10, request_id=rid), instruction=obs[0].instruction,
                   observations=obs, actions=actions)


class Recording(WrappedPolicy):
    """A policy that hands every batch to an inner policy and keeps the batches it saw. With
    `hold_first`, the first act() signals `entered` and blocks until `release` is set (a model's
    forward pass that lasts exactly as long as the test needs)."""

    def __init__(self, inner, hold_first: bool = False):
        super().__init__(inner)
        self.batches = []
        self.hold_first, self.entered, self.release = hold_first, threading.Event(), threading.Event()

    def act(self, contexts):
        self.batches.append(list(contexts))
        if self.hold_first and len(self.batches) == 1:
            self.entered.set()
            assert self.release.wait(WAIT_S), "the test never released the first batch"
        return self.inner.act(contexts)


class Scripted:
    """A policy that writes the given assistant texts, one per call in order (a model's raw turns)."""

    name = "scripted-text"

    def __init__(self, texts, reflection=""):
        self.texts, self.reflection = list(texts), reflection

    def act(self, contexts):
        return [PolicyOutput.from_text(self.texts.pop(0), c.observation) for c in contexts]

    def reflect(self, request):
        return self.reflection

    def stats(self):
        return {}

    def close(self):
        pass


def test_concurrent_calls_become_one_batch_without_waiting_the_window():
    policy = Recording(ScriptedTeacher())
    # A window far longer than the test's wait: the calls can only complete if a full batch goes at once.
    bridge = PolicyBridge(policy, max_batch=3, window_s=3600.0)

    async def main():
        for i in range(3):
            bridge.begin(f"r{i}", AttemptSpec(attempt=2, reflections=(f"reflection {i}",)))
        return await asyncio.wait_for(asyncio.gather(*(bridge(history(f"r{i}")) for i in range(3))), WAIT_S)

    actions = asyncio.run(main())
    assert len(policy.batches) == 1 and [c.key for c in policy.batches[0]] == ["r0/0", "r1/0", "r2/0"]
    assert [c.reflections for c in policy.batches[0]] == [("reflection 0",), ("reflection 1",), ("reflection 2",)]
    assert all(c.attempt == 2 and c.task_id == TASK.id for c in policy.batches[0])
    assert all(isinstance(a, Action) for a in actions)
    assert bridge.stats()["mean_batch"] == 3.0 and bridge.stats()["largest_batch"] == 3


def test_calls_within_the_window_batch_and_calls_during_a_batch_queue_for_the_next():
    policy = Recording(ScriptedTeacher(), hold_first=True)
    bridge = PolicyBridge(policy, max_batch=4, window_s=0.5)

    async def main():
        # a opens the window; b arrives one loop turn later, inside it (a batch of 2 < max_batch
        # goes when the window closes).
        first = [asyncio.ensure_future(bridge(history("a")))]
        await asyncio.sleep(0)
        first.append(asyncio.ensure_future(bridge(history("b"))))
        # c and d arrive while that batch is with the policy (held until released).
        assert await asyncio.to_thread(policy.entered.wait, WAIT_S), "the window never closed"
        second = [asyncio.ensure_future(bridge(history(name))) for name in ("c", "d")]
        await asyncio.sleep(0)
        policy.release.set()
        await asyncio.wait_for(asyncio.gather(*first, *second), WAIT_S)
        await asyncio.wait_for(bridge(history("e")), WAIT_S)

    asyncio.run(main())
    # a and b arrive within the window: one batch; c and d queue while it runs and go together
    # as soon as it is done; e comes alone.
    assert [[c.key for c in b] for b in policy.batches] == [["a/0", "b/0"], ["c/0", "d/0"], ["e/0"]]


def test_history_is_built_from_recorded_turns_and_unparseable_turns_run_as_wait():
    click = format_action(Action.click(500, 500), "I click the middle.")
    policy = Recording(Scripted([click, "I am not sure what to do.", click]))
    bridge = PolicyBridge(policy, max_batch=1, fallback_wait_s=0.25)

    async def main():
        bridge.begin("r@1", AttemptSpec(attempt=1))
        a0 = await bridge(history("r@1", 0))
        a1 = await bridge(history("r@1", 1))
        a2 = await bridge(history("r@1", 2))
        return a0, a1, a2

    a0, a1, a2 = asyncio.run(main())
    assert a0 == Action.click(500, 500) and a1 == Action("wait", seconds=0.25) and a2 == a0
    last = policy.batches[-1][0]
    assert last.step == 2 and last.key == "r@1/2" and last.reflections == ()
    assert [(p.thought, p.action_text) for p in last.history] == [
        ("I click the middle.", format_action(Action.click(500, 500))), ("I am not sure what to do.", "")]
    assert last.history[0].screenshot == observation("r@1/0").screenshot
    outputs = bridge.end("r@1")
    assert sorted(outputs) == [0, 1, 2]
    assert outputs[1].action is None and outputs[1].error.startswith("no_tool_call")
    assert split_turn(outputs[1]) == ("I am not sure what to do.", "")
    assert bridge.stats()["parse_errors"] == 1
    assert bridge.end("r@1") == {}  # forgotten


def test_policy_errors_reach_every_waiting_episode():
    class Broken(Scripted):
        def act(self, contexts):
            raise RuntimeError("endpoint down")

    bridge = PolicyBridge(Broken([]), max_batch=2, window_s=0.01)

    async def main():
        return await asyncio.gather(bridge(history("x")), bridge(history("y")), return_exceptions=True)

    results = asyncio.run(main())
    assert [str(r) for r in results] == ["endpoint down", "endpoint down"]

    class Short(Scripted):
        def act(self, contexts):
            return []

    with pytest.raises(TypeError, match=r"returned list of length 0 for 1 contexts"):
        asyncio.run(PolicyBridge(Short([]), max_batch=1)(history("z")))


def test_reflect_goes_through_the_policy_and_checks_the_type():
    request = ReflectionRequest(task_id=TASK.id, instruction="Click", attempt=1, steps=(), verdict="failure",
                                verdict_reason="reward -1", key="miniwob.click-button#0@1")
    bridge = PolicyBridge(Scripted([], reflection="Step 1 (wrong element): click Submit instead."))
    assert asyncio.run(bridge.reflect(request)) == "Step 1 (wrong element): click Submit instead."
    # The teacher has no record of this attempt; it says so rather than inventing a mistake.
    assert "no record of this attempt" in asyncio.run(PolicyBridge(ScriptedTeacher()).reflect(request))
    with pytest.raises(TypeError, match="expected the reflection text"):
        asyncio.run(PolicyBridge(Scripted([], reflection=None)).reflect(request))
