"""A pool of browser workers on one host that runs whole episodes for its callers (async).

Each request becomes exactly one Episode: a browser crash or hang mid-episode restarts that
worker's browser and runs the episode again from reset (up to `max_attempts`), so a
half-finished episode is never handed on as complete.

Remote browsers (WorkerConfig.cdp_endpoints, worker i on endpoint i mod n): an endpoint that stays
down (its reconnection gave up: worker.EndpointLost) is declared down for the rest of the pool's life,
named in `down_endpoints` and on stderr. Its workers take no more episodes; the episode that was running
on one of them runs again from reset on a free worker of a live endpoint (a move: one more run, never one
of the max_attempts, and never a second Episode), and so does every later episode asked of its slots.
The callers do not change: `run_episode(slot, ...)` for a slot whose endpoint is down borrows a live
worker. With every endpoint down, AllEndpointsDown names them all. An endpoint that comes back is not
taken up again by this pool (a new pool, e.g. the next stage run, connects to it).
"""
from __future__ import annotations

import asyncio
import dataclasses
import inspect
import sys
import time
from typing import Any, AsyncIterator, Awaitable, Callable, Iterable, Union

from playwright.async_api import async_playwright

from rmsweb_jax.web.actions import Action
from rmsweb_jax.web.browser import EndpointDown, kill_marked, new_marker
from rmsweb_jax.web.episode import COMPLETE, FAILED, Episode, EpisodeRequest, History
from rmsweb_jax.web.suite import Suite
from rmsweb_jax.web.worker import BrowserWorker, EndpointLost, WorkerConfig, WorkerFault

EpisodePolicy = Callable[[History], Union[Action, Awaitable[Action]]]


class AllEndpointsDown(EndpointDown):
    """Every remote Chromium of the pool is down: no worker is left to run an episode on."""


class AsyncWorkerPool:
    """N BrowserWorkers sharing one Playwright driver.

        async with AsyncWorkerPool(suite, workers=4) as pool:
            async for episode in pool.run(requests, policy):
                ...

    `policy(history) -> Action` may be a coroutine function (awaited on the loop) or a plain
    function (run in a thread, so a slow model does not stall the other workers).
    """

    def __init__(self, suite: Suite, workers: int = 2, config: WorkerConfig | None = None, *, max_attempts: int = 3,
                 start_timeout_s: float | None = None):
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers!r}")
        if max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {max_attempts!r}")
        self.suite = suite
        self.size = workers
        self.config = config or WorkerConfig()
        self.max_attempts = max_attempts
        # None: room for every launch attempt of a worker (they start concurrently) plus the driver
        self.start_timeout_s = start_timeout_s if start_timeout_s is not None else \
            self.config.launch_timeout_s * self.config.launch_attempts + 30.0
        self.marker = new_marker()
        self.workers: list[BrowserWorker] = []
        self.down_endpoints: dict[str, str] = {}  # endpoint -> why it was declared down
        self._idle: set[int] = set()  # slots whose worker runs no episode
        self._changed: asyncio.Event | None = None  # set (and replaced) when a worker is freed or an endpoint goes down
        self._playwright_cm = None
        self._playwright = None

    async def __aenter__(self) -> "AsyncWorkerPool":
        await self.start()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def start(self) -> None:
        """Starts Playwright and every worker's browser (concurrently)."""
        try:
            self._changed = asyncio.Event()
            self._playwright_cm = async_playwright()
            self._playwright = await asyncio.wait_for(self._playwright_cm.start(), self.start_timeout_s)
            self.workers = [BrowserWorker(self.suite, self.config, playwright=self._playwright,
                                          marker=f"{self.marker}-{i}", slot=i) for i in range(self.size)]
            started = await asyncio.wait_for(asyncio.gather(*(w.start() for w in self.workers), return_exceptions=True),
                                             self.start_timeout_s)
            for error in started:  # an endpoint down from the start leaves its episodes to the others
                if isinstance(error, BaseException) and not isinstance(error, EndpointDown):
                    raise error
            for worker, error in zip(self.workers, started):
                if isinstance(error, EndpointDown):
                    self._declare_down(worker.endpoint, str(error))
            self._idle = set(range(self.size))
            self._live_slots()  # raises AllEndpointsDown when none is left
        except BaseException:
            await self.close()
            raise

    async def close(self) -> None:
        """Closes every browser the pool started (killing stragglers) and the driver."""
        workers, self.workers, self._idle = self.workers, [], set()
        await asyncio.gather(*(w.close() for w in workers), return_exceptions=True)
        if self._playwright_cm is not None:
            cm, self._playwright_cm, self._playwright = self._playwright_cm, None, None
            try:
                await asyncio.wait_for(cm.__aexit__(None, None, None), self.config.close_timeout_s)
            except Exception:  # noqa: BLE001 — the driver is gone already
                pass
        kill_marked(self.marker)

    def browser_pid(self, worker: int) -> int | None:
        """Returns the pid of worker `worker`'s browser (None while it has none)."""
        return self.workers[worker].browser_pid

    async def run(self, requests: Iterable[EpisodeRequest], policy: EpisodePolicy) -> AsyncIterator[Episode]:
        """Yields one Episode per request, in order of completion.

        An exception raised by the policy stops the run and propagates (after the other
        workers' episodes are cancelled); browser faults never do.
        """
        if not self.workers:
            raise RuntimeError("the pool is not started (use `async with` or start())")
        queue: asyncio.Queue = asyncio.Queue()
        for request in requests:
            queue.put_nowait(request)
        results: asyncio.Queue = asyncio.Queue()
        total = queue.qsize()

        async def serve(slot: int) -> None:
            while True:
                try:
                    request = queue.get_nowait()
                except asyncio.QueueEmpty:
                    return
                await results.put(await self.run_episode(slot, request, policy))

        tasks = [asyncio.create_task(serve(i), name=f"worker-{i}") for i in range(len(self.workers))]
        delivered = 0
        try:
            while delivered < total:
                getter = asyncio.create_task(results.get())
                running = [t for t in tasks if not t.done()]
                done, _ = await asyncio.wait([getter, *running], return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    if task is not getter and task.exception() is not None:
                        getter.cancel()
                        raise task.exception()
                if getter in done:
                    delivered += 1
                    yield getter.result()
                else:
                    getter.cancel()
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def run_episode(self, slot: int, request: EpisodeRequest, policy: EpisodePolicy) -> Episode:
        """Returns the Episode for `request` run on worker `slot` (or, when slot's endpoint is down, on a free
        worker of a live one), re-running it from reset after a browser fault (at most max_attempts attempts;
        a run lost with its endpoint moves to another endpoint without using one up).

        Raises AllEndpointsDown when no live endpoint is left."""
        faults: list[str] = []
        started = time.monotonic()
        runs = lost = 0
        while lost < self.max_attempts:
            held = await self._lease(slot)
            runs += 1
            try:
                episode = await self._attempt(self.workers[held], held, request, policy, runs)
            except EndpointLost as fault:
                faults.append(f"{fault} (the episode moves to another endpoint)")
                self._declare_down(fault.endpoint, str(fault))
                continue
            except WorkerFault as fault:
                faults.append(str(fault))
                lost += 1
                continue
            finally:
                self._release(held)
            return dataclasses.replace(episode, attempts=runs, faults=tuple(faults), wall_s=time.monotonic() - started)
        return Episode(request=request, status=FAILED, attempts=runs, faults=tuple(faults),
                       reason=f"{self.max_attempts} attempts hit browser faults", wall_s=time.monotonic() - started)

    def _live_slots(self) -> list[int]:
        live = [i for i, w in enumerate(self.workers) if w.endpoint not in self.down_endpoints]
        if not live:
            raise AllEndpointsDown("every remote Chromium of the pool is down (web.cdp_endpoint): " + "; ".join(
                f"{endpoint}: {why}" for endpoint, why in self.down_endpoints.items()))
        return live

    async def _lease(self, slot: int) -> int:
        """Returns the slot of the worker to run an episode of `slot` on, taken from the idle ones: slot's own
        once it is free, or, its endpoint down, the first free worker of a live endpoint."""
        if not self.workers:
            raise RuntimeError("the pool is not started (use `async with` or start())")
        while True:
            live = self._live_slots()
            choice = ([slot] if slot in live else live)
            free = [i for i in choice if i in self._idle]
            if free:
                self._idle.discard(free[0])
                return free[0]
            await self._changed.wait()  # a worker freed or an endpoint declared down

    def _release(self, slot: int) -> None:
        if self.workers:  # not after close()
            self._idle.add(slot)
            self._wake()

    def _wake(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    def _declare_down(self, endpoint: str, why: str) -> None:
        """Declares `endpoint` down for the rest of the pool's life: its workers take no more episodes and
        reconnect no more (an episode running on one ends at its next fault, then moves)."""
        if endpoint in self.down_endpoints:
            return
        self.down_endpoints[endpoint] = why
        for worker in self.workers:
            if worker.endpoint == endpoint:
                worker.endpoint_down = f"the pool declared the remote Chromium at {endpoint} down"
        live = sorted({w.endpoint for w in self.workers if w.endpoint not in self.down_endpoints})
        print(f"[pool] the remote Chromium at {endpoint} is down ({why}); its episodes go to "
              f"{', '.join(live) if live else 'no live endpoint: none is left'}", file=sys.stderr, flush=True)
        self._wake()

    async def _attempt(self, worker: BrowserWorker, slot: int, request: EpisodeRequest, policy: EpisodePolicy,
                       attempt: int) -> Episode:
        obs = await worker.reset(request.task, request.seed, request.request_id)
        instruction = obs.instruction
        observations, actions = [obs], []
        info: dict[str, Any] = {}
        done = False
        while not done and len(actions) < request.max_steps:
            history = History(request=request, instruction=instruction, observations=tuple(observations),
                              actions=tuple(actions), attempt=attempt, worker=slot)
            action = await _call(policy, history)
            if not isinstance(action, Action):
                raise TypeError(f"policy returned {type(action).__name__}; expected an Action")
            obs, done, info = await worker.step(action)
            observations.append(obs)
            actions.append(obs.last_action)
        recording, off_record = await worker.finish_tape()
        return Episode(request=request, status=COMPLETE, instruction=instruction, observations=tuple(observations),
                       actions=tuple(actions), reward=info.get("reward"), success=info.get("success"),
                       reason=info.get("reason") if done else "step limit", done=done and not info.get("truncated"),
                       truncated=not done or bool(info.get("truncated")),
                       recording=None if recording is None else recording.to_dict(), off_record=off_record)


async def _call(policy: EpisodePolicy, history: History) -> Action:
    if inspect.iscoroutinefunction(policy) or inspect.iscoroutinefunction(getattr(policy, "__call__", None)):
        return await policy(history)
    result = await asyncio.to_thread(policy, history)
    return await result if inspect.isawaitable(result) else result
