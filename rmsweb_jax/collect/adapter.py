"""PolicyBridge: the pool's one-episode `policy(history) -> Action` over a batched Policy.act.

Each browser worker asks for one action at a time; a model is fastest asked for many at once.
The bridge gathers the requests that arrive together (up to `max_batch`, or what arrived within
`window_s` of the first) into one `act()` call, run in a thread so the browsers keep stepping.
While one batch is with the policy, new requests queue for the next. `act` and `reflect` never
run at the same time (one lock), so a policy need not be thread-safe.
"""
from __future__ import annotations

import asyncio
import dataclasses
import threading
from typing import Sequence

from rmsweb_jax.agents.policy import PastStep, Policy, PolicyOutput, ReflectionRequest, StepContext
from rmsweb_jax.web.action_text import OPEN, format_action
from rmsweb_jax.web.actions import Action
from rmsweb_jax.web.episode import History


@dataclasses.dataclass(frozen=True)
class AttemptSpec:
    """What the bridge adds to a pool request: the retry attempt (1..K), the reflections in
    the policy's context for it, and the draw of the policy's randomness (StepContext.draw)."""

    attempt: int = 1
    reflections: tuple[str, ...] = ()
    draw: int = 1


def split_turn(output: PolicyOutput) -> tuple[str, str]:
    """Returns (thought, tool-call text) of a policy turn: the canonical tool call for a parsed
    action, the raw text from the first <tool_call> otherwise ("" when there is none)."""
    if output.action is not None:
        return output.thought, format_action(output.action)
    start = output.text.find(OPEN)
    return output.thought, "" if start < 0 else output.text[start:]


class PolicyBridge:
    """An async `policy(history) -> Action` for AsyncWorkerPool that batches Policy.act calls.

        bridge = PolicyBridge(policy, max_batch=workers)
        bridge.begin(request_id, AttemptSpec(attempt=2, reflections=(...,)))
        episode = await pool.run_episode(slot, request, bridge)
        outputs = bridge.end(request_id)   # {step: PolicyOutput} of that episode

    An unparseable turn becomes `Action("wait", seconds=fallback_wait_s)` (harmless: nothing
    on the page changes); its PolicyOutput keeps the error for the store. An exception in
    `act` reaches every episode of the batch (the pool then stops the run).
    """

    def __init__(self, policy: Policy, *, max_batch: int = 8, window_s: float = 0.02, fallback_wait_s: float = 0.0):
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch!r}")
        if window_s < 0 or fallback_wait_s < 0:
            raise ValueError(f"window_s and fallback_wait_s must be >= 0, got {window_s!r}, {fallback_wait_s!r}")
        self.policy = policy
        self.max_batch = max_batch
        self.window_s = window_s
        self.fallback_wait_s = fallback_wait_s
        self._specs: dict[str, AttemptSpec] = {}
        self._outputs: dict[str, dict[int, PolicyOutput]] = {}
        self._pending: list[tuple[StepContext, asyncio.Future]] = []
        self._timer: asyncio.TimerHandle | None = None
        self._busy = False
        self._policy_lock = threading.Lock()
        self.act_calls = 0
        self.contexts = 0
        self.reflect_calls = 0
        self.parse_errors = 0
        self.largest_batch = 0

    # --- episodes -------------------------------------------------------------------------
    def begin(self, request_id: str, spec: AttemptSpec = AttemptSpec()) -> None:
        """Registers the attempt a request runs (its reflections); forgets earlier outputs."""
        self._specs[request_id] = spec
        self._outputs[request_id] = {}

    def end(self, request_id: str) -> dict[int, PolicyOutput]:
        """Returns {step: PolicyOutput} recorded for `request_id` and forgets the request."""
        self._specs.pop(request_id, None)
        return self._outputs.pop(request_id, {})

    def context(self, history: History) -> StepContext:
        """Returns the StepContext for the pool's `history` (earlier turns from this bridge)."""
        request_id = history.request.request_id
        spec = self._specs.get(request_id, AttemptSpec())
        outputs = self._outputs.setdefault(request_id, {})
        step = len(history.actions)
        past = []
        for i in range(step):
            if i not in outputs:
                raise RuntimeError(f"{request_id}: no recorded policy turn for step {i} (steps must come through "
                                   "this bridge in order)")
            thought, action_text = split_turn(outputs[i])
            obs = history.observations[i]
            past.append(PastStep(screenshot=obs.screenshot, url=obs.url, thought=thought, action_text=action_text))
        task = history.request.task
        return StepContext(task_id=str(getattr(task, "id", task)), instruction=history.instruction,
                           observation=history.observation, history=tuple(past), reflections=spec.reflections,
                           attempt=spec.attempt, step=step, key=f"{request_id}/{step}", draw=spec.draw)

    async def __call__(self, history: History) -> Action:
        context = self.context(history)
        future = asyncio.get_running_loop().create_future()
        self._pending.append((context, future))
        self._schedule()
        output: PolicyOutput = await future
        request_id = history.request.request_id
        self._outputs.setdefault(request_id, {})[context.step] = output
        if output.action is None:
            self.parse_errors += 1
            return Action("wait", seconds=self.fallback_wait_s)
        return output.action

    # --- batching -------------------------------------------------------------------------
    def _schedule(self) -> None:
        if self._busy:
            return  # the batch in flight starts the next one when it is done
        if len(self._pending) >= self.max_batch or self.window_s == 0:
            self._start()
        elif self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self.window_s, self._start)

    def _start(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._pending = [(c, f) for c, f in self._pending if not f.done()]  # drop cancelled episodes
        if self._busy or not self._pending:
            return
        batch, self._pending = self._pending[:self.max_batch], self._pending[self.max_batch:]
        self._busy = True
        asyncio.get_running_loop().create_task(self._run(batch))

    async def _run(self, batch: list[tuple[StepContext, asyncio.Future]]) -> None:
        try:
            outputs = await asyncio.to_thread(self._act, [c for c, _ in batch])
            for (_, future), output in zip(batch, outputs):
                if not future.done():
                    future.set_result(output)
        except BaseException as e:  # noqa: BLE001 — handed to each waiting episode
            for _, future in batch:
                if not future.done():
                    future.set_exception(e)
            if not isinstance(e, Exception):
                raise
        finally:
            self._busy = False
            if self._pending:  # these waited for the whole batch already: no window
                self._start()

    def _act(self, contexts: Sequence[StepContext]) -> list[PolicyOutput]:
        with self._policy_lock:
            outputs = self.policy.act(contexts)
        self.act_calls += 1
        self.contexts += len(contexts)
        self.largest_batch = max(self.largest_batch, len(contexts))
        if not isinstance(outputs, list) or len(outputs) != len(contexts):
            raise TypeError(f"policy {getattr(self.policy, 'name', self.policy)!r}.act returned "
                            f"{type(outputs).__name__} of length {len(outputs) if hasattr(outputs, '__len__') else '?'}"
                            f" for {len(contexts)} contexts; expected a list of {len(contexts)} PolicyOutput")
        for output in outputs:
            if not isinstance(output, PolicyOutput):
                raise TypeError(f"policy {getattr(self.policy, 'name', self.policy)!r}.act returned a "
                                f"{type(output).__name__}; expected PolicyOutput")
        return outputs

    # --- reflections ----------------------------------------------------------------------
    async def reflect(self, request: ReflectionRequest) -> str:
        """Returns the policy's reflection on a failed attempt (run in a thread, never while act
        runs). Raises TypeError when the policy returns anything but a string."""
        def call() -> str:
            with self._policy_lock:
                return self.policy.reflect(request)
        text = await asyncio.to_thread(call)
        self.reflect_calls += 1
        if not isinstance(text, str):
            raise TypeError(f"policy {getattr(self.policy, 'name', self.policy)!r}.reflect returned "
                            f"{type(text).__name__}; expected the reflection text (str)")
        return text

    def stats(self) -> dict[str, float]:
        """Returns {"act_calls", "contexts", "mean_batch", "largest_batch", "reflect_calls",
        "parse_errors"}."""
        return {"act_calls": self.act_calls, "contexts": self.contexts,
                "mean_batch": round(self.contexts / self.act_calls, 2) if self.act_calls else 0.0,
                "largest_batch": self.largest_batch,
                "reflect_calls": self.reflect_calls, "parse_errors": self.parse_errors}
