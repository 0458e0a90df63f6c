"""WorkerPool: the blocking face of AsyncWorkerPool, for callers that are not async.

The pool's event loop runs in a background thread. Leaving the `with` block (normally, on an
exception or on Ctrl-C) closes every browser; browsers that do not close in time are killed by
marker, and an atexit hook kills any that are still left when the interpreter exits.
"""
from __future__ import annotations

import asyncio
import atexit
import queue
from typing import Iterable, Iterator

from rmsweb_jax.web.browser import kill_marked
from rmsweb_jax.web.episode import Episode, EpisodeRequest
from rmsweb_jax.web.loop_thread import POLL_S, LoopThread
from rmsweb_jax.web.pool import AsyncWorkerPool, EpisodePolicy
from rmsweb_jax.web.suite import Suite
from rmsweb_jax.web.worker import WorkerConfig


class WorkerPool:
    """A pool of N browser workers that runs episodes:

        with WorkerPool(suite, workers=4) as pool:
            for episode in pool.run(requests, policy):
                ...

    `run` yields exactly one Episode per request, in order of completion.
    """

    def __init__(self, suite: Suite, workers: int = 2, config: WorkerConfig | None = None, *, max_attempts: int = 3,
                 start_timeout_s: float | None = None):
        self._pool = AsyncWorkerPool(suite, workers, config, max_attempts=max_attempts, start_timeout_s=start_timeout_s)
        self._loop: LoopThread | None = None
        self._atexit = lambda marker=self._pool.marker: kill_marked(marker)

    @property
    def marker(self) -> str:
        """Returns the marker every browser of this pool carries on its command line."""
        return self._pool.marker

    @property
    def size(self) -> int:
        """Returns the number of workers."""
        return self._pool.size

    @property
    def down_endpoints(self) -> dict[str, str]:
        """Returns the remote browsers declared down for good (address -> why); their episodes ran on the others."""
        return dict(self._pool.down_endpoints)

    def browser_pid(self, worker: int) -> int | None:
        """Returns the pid of worker `worker`'s browser (None while it has none)."""
        return self._pool.browser_pid(worker)

    def start(self) -> "WorkerPool":
        """Starts the loop thread and every worker's browser."""
        if self._loop is not None:
            return self
        self._loop = LoopThread(name=f"pool-{self.marker}")
        atexit.register(self._atexit)
        try:
            self._loop.run(self._pool.start(), self._pool.start_timeout_s + 10)
        except BaseException:
            self.close()
            raise
        return self

    def run(self, requests: Iterable[EpisodeRequest], policy: EpisodePolicy) -> Iterator[Episode]:
        """Yields one Episode per request as they finish; a policy exception propagates."""
        if self._loop is None:
            raise RuntimeError("the pool is not started (use `with WorkerPool(...)` or start())")
        requests = list(requests)
        out: queue.Queue = queue.Queue()

        async def pump():
            episodes = self._pool.run(requests, policy)
            try:
                async for episode in episodes:
                    out.put(("episode", episode))
            except BaseException as e:  # noqa: BLE001 — handed to the calling thread
                out.put(("error", e))
            finally:
                await episodes.aclose()
                out.put(("end", None))

        future = self._loop.submit(pump())
        try:
            while True:
                try:
                    kind, item = out.get(timeout=POLL_S)
                except queue.Empty:
                    continue
                if kind == "episode":
                    yield item
                elif kind == "error":
                    if not isinstance(item, asyncio.CancelledError):
                        raise item
                else:
                    return
        finally:
            if not future.done():
                future.cancel()
                try:
                    future.result(timeout=10)
                except BaseException:  # noqa: BLE001 — cancelled, as asked
                    pass

    def close(self) -> None:
        """Closes every browser and stops the loop thread (idempotent)."""
        loop, self._loop = self._loop, None
        if loop is not None:
            try:
                loop.run(self._pool.close(), 30)
            except BaseException:  # noqa: BLE001 — fall through to the kill below
                pass
            loop.close()
        kill_marked(self.marker)
        atexit.unregister(self._atexit)

    def __enter__(self) -> "WorkerPool":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()
