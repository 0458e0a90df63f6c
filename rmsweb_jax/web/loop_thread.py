"""An asyncio event loop in a background thread, for blocking callers of async workers."""
from __future__ import annotations

import asyncio
import concurrent.futures
import math
import threading
from typing import Any, Awaitable, Coroutine

from rmsweb_jax.preemption import Preempted

POLL_S = 0.2  # blocking waits wake this often, so Ctrl-C reaches the calling thread promptly
_UNWIND_S = 60.0  # after Ctrl-C, how long run_sync waits for the cancelled coroutine to close its browsers


class LoopThread:
    """Runs an event loop in a daemon thread until close().

        loop = LoopThread()
        obs = loop.run(worker.reset(task), timeout_s=60)
    """

    def __init__(self, name: str = "rmsweb-loop"):
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def submit(self, coro: Awaitable[Any]) -> concurrent.futures.Future:
        """Schedules `coro` on the loop and returns its future."""
        if self.loop.is_closed():
            raise RuntimeError("the loop thread is closed")
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro: Awaitable[Any], timeout_s: float = 300.0) -> Any:
        """Returns the result of `coro` run on the loop; raises TimeoutError (and cancels it)
        after `timeout_s`."""
        return wait_future(self.submit(coro), timeout_s)

    def close(self, timeout_s: float = 10.0) -> None:
        """Stops the loop and joins the thread (idempotent)."""
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=timeout_s)
        if not self.loop.is_running():
            self.loop.close()

    def __enter__(self) -> "LoopThread":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def wait_future(future: concurrent.futures.Future, timeout_s: float) -> Any:
    """Returns `future`'s result, polling so that KeyboardInterrupt is delivered while waiting;
    cancels it and raises TimeoutError after `timeout_s`."""
    waited = 0.0
    while True:
        try:
            return future.result(timeout=POLL_S)
        except concurrent.futures.TimeoutError:
            waited += POLL_S
            if waited >= timeout_s:
                future.cancel()
                raise TimeoutError(f"operation did not finish within {timeout_s:g}s") from None


def run_sync(coro: Coroutine[Any, Any, Any]) -> Any:
    """Returns the result of `coro` run to completion, also when the calling thread already runs an
    event loop (every Jupyter/Colab cell does): asyncio.run() refuses a running loop, and waiting
    here on a task of that same loop would deadlock it, so the coroutine then runs under
    asyncio.run() in a thread of its own while this thread waits (Ctrl-C cancels it)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    # asyncio.run() in the private thread, not a LoopThread: the same teardown as the plain path
    # (tasks left over cancelled, async generators and the default executor shut down).
    result: concurrent.futures.Future = concurrent.futures.Future()
    started: concurrent.futures.Future = concurrent.futures.Future()

    async def main() -> Any:
        started.set_result((asyncio.get_running_loop(), asyncio.current_task()))
        return await coro

    def target() -> None:
        try:
            result.set_result(asyncio.run(main()))
        except BaseException as e:  # handed to the waiting thread, which raises it
            result.set_exception(e)

    thread = threading.Thread(target=target, name="rmsweb-run-sync", daemon=True)
    try:  # a Ctrl-C right after start() (the coroutine already running) must cancel it too
        thread.start()
        return wait_future(result, math.inf)
    except (KeyboardInterrupt, Preempted):  # Ctrl-C, SIGTERM: the coroutine is cancelled and unwinds in its thread
        if not thread.is_alive() and not started.done():
            raise  # interrupted before the thread started: nothing runs
        loop, task = started.result(timeout=_UNWIND_S)
        try:
            loop.call_soon_threadsafe(task.cancel)
        except RuntimeError:  # "Event loop is closed": the coroutine finished meanwhile, nothing to cancel
            pass
        thread.join(timeout=_UNWIND_S)  # let its finally blocks close browsers and the store
        raise
