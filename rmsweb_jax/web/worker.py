"""A browser worker: one Chromium, one episode at a time, restarted when it crashes or hangs."""
from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Any

from playwright.async_api import Error as PlaywrightError
from playwright.async_api import async_playwright

from rmsweb_jax.web.action_executor import ActionFailed, execute_action
from rmsweb_jax.web.actions import RELATIVE, Action, CoordinateSpace
from rmsweb_jax.web.browser import (EndpointDown, close_browser, connect_chromium, kill_marked, launch_chromium,
                                    marked_pids, new_marker)
from rmsweb_jax.web.guard import ContextGuard
from rmsweb_jax.web.observation import Observation
from rmsweb_jax.web.page_reader import read_page
from rmsweb_jax.web.recording import Recording, Tape, TapeSession
from rmsweb_jax.web.safety import RequestPolicy
from rmsweb_jax.web.semantics import resolve_target
from rmsweb_jax.web.suite import Suite


# Errors that mean "the page navigated while we read it", not "the browser is broken".
_NAVIGATION_RACES = ("execution context was destroyed", "not attached", "cannot find context", "navigat",
                     "unable to capture screenshot")
_READ_ATTEMPTS = 4


class WorkerFault(RuntimeError):
    """The browser or page crashed or hung. The worker has restarted its browser (or, when the
    relaunch failed too, will launch one on the next reset); the episode in progress is lost
    and must be run again from reset."""


class EndpointLost(WorkerFault):
    """The worker's remote browser (a CDP endpoint) is gone and did not come back within the reconnection's
    attempts (EndpointDown), or the pool has declared its endpoint down: the worker will not reconnect, and the
    episode in progress must run on a worker of another endpoint. `endpoint` is the address."""

    def __init__(self, endpoint: str, reason: str):
        super().__init__(reason)
        self.endpoint = endpoint


class EpisodeNotRunning(RuntimeError):
    """step() called before reset(), after the episode ended, or after a fault."""


@dataclasses.dataclass(frozen=True)
class WorkerConfig:
    """Browser and timing settings of a worker.

    `step_timeout_s` bounds one action plus its observation, `reset_timeout_s` one reset
    (page load included), `episode_timeout_s` (optional) the episode's wall time: past it the
    next step ends the episode as truncated. `coordinates` is "relative" (Qwen's 0-1000) or
    "pixel" (screenshot pixels).
    """

    executable: str | None = None
    headless: bool = True
    coordinates: str = "relative"
    step_timeout_s: float = 15.0
    reset_timeout_s: float = 30.0
    episode_timeout_s: float | None = None
    launch_timeout_s: float = 30.0
    launch_attempts: int = 3            # a launch that hangs past launch_timeout_s is killed and retried
    close_timeout_s: float = 5.0
    navigation_timeout_s: float = 10.0
    fast_png: bool = True
    extra_args: tuple[str, ...] = ()
    tape: Tape | None = None            # record every episode's traffic, or replay it (web/recording.py)
    cdp_endpoints: tuple[str, ...] = ()  # remote Chromiums (connect_over_cdp) instead of launching one; the pool's
                                         # worker i drives endpoint i mod n; launch_attempts / _timeout_s bound a
                                         # (re)connection

    def __post_init__(self):
        if self.coordinates not in ("relative", "pixel"):
            raise ValueError(f"WorkerConfig.coordinates must be 'relative' or 'pixel', got {self.coordinates!r}")
        for name in ("step_timeout_s", "reset_timeout_s", "launch_timeout_s", "close_timeout_s", "navigation_timeout_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"WorkerConfig.{name} must be positive, got {getattr(self, name)!r}")
        if self.launch_attempts < 1:
            raise ValueError(f"WorkerConfig.launch_attempts must be at least 1, got {self.launch_attempts!r}")


@dataclasses.dataclass
class _Episode:
    task: Any
    seed: int
    instruction: str
    started: float
    last: Observation
    steps: int = 0
    done: bool = False


class BrowserWorker:
    """Owns one Chromium and runs one episode at a time (async).

        async with BrowserWorker(suite) as worker:
            obs = await worker.reset(task, seed=0)
            obs, done, info = await worker.step(Action.click(500, 300))

    A crash or hang during reset or step restarts the browser and raises WorkerFault; so does
    a failure of that restart (the next reset launches again).
    `playwright` may be shared between workers of one pool; `marker` tags this worker's browser;
    `slot` (the pool's worker index) picks its endpoint when WorkerConfig.cdp_endpoints names remote
    browsers: then a crash or a dropped connection reconnects (with backoff) instead of relaunching.
    """

    def __init__(self, suite: Suite, config: WorkerConfig | None = None, *, playwright=None, marker: str | None = None,
                 slot: int = 0):
        self.suite = suite
        self.config = config or WorkerConfig()
        endpoints = self.config.cdp_endpoints
        self.endpoint = endpoints[slot % len(endpoints)] if endpoints else None  # None: a local Chromium
        self.marker = marker or new_marker()
        self.restarts = 0
        self._playwright = playwright
        self._playwright_cm = None
        self._browser = None
        self._context = None
        self._guard: ContextGuard | None = None
        self._episode: _Episode | None = None
        self._tape: TapeSession | None = None
        self._dead = False
        self._phase: str | None = None  # what a guarded call is waiting on: a timeout names it
        self.endpoint_down: str | None = None  # why the pool declared this worker's endpoint down (no reconnects)

    # --- lifecycle ----------------------------------------------------------------------
    async def __aenter__(self) -> "BrowserWorker":
        await self.start()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def start(self) -> None:
        """Launches the browser (and Playwright, unless one was given)."""
        if self._playwright is None:
            self._playwright_cm = async_playwright()
            self._playwright = await self._playwright_cm.start()
        if self._browser is None:
            await self._launch()

    async def _launch(self) -> None:
        self._dead = False
        if self.endpoint is not None:
            self._browser = await connect_chromium(self._playwright, self.endpoint,
                                                   timeout_s=self.config.launch_timeout_s,
                                                   attempts=self.config.launch_attempts)
            self._browser.on("disconnected", self._on_disconnected)
            self._context = None
            return
        self._browser = await launch_chromium(
            self._playwright, self.marker, executable=self.config.executable, headless=self.config.headless,
            extra_args=self.config.extra_args, timeout_s=self.config.launch_timeout_s,
            attempts=self.config.launch_attempts)
        self._browser.on("disconnected", self._on_disconnected)
        self._context = None

    def _on_disconnected(self, browser=None) -> None:
        # A replaced browser's event may come late (a remote one's connection drops after the reconnect):
        # it says nothing about the browser in use now.
        if browser is None or browser is self._browser:
            self._dead = True

    async def restart(self) -> None:
        """Kills and relaunches the browser; any episode in progress is dropped."""
        self._episode = None
        browser, self._browser, self._context, self._guard = self._browser, None, None, None
        await close_browser(browser, self.marker, self.config.close_timeout_s)
        self.restarts += 1
        await self._launch()

    async def close(self) -> None:
        """Closes the browser (killing it if it does not close in time) and Playwright if owned."""
        self._episode = None
        browser, self._browser, self._context, self._guard = self._browser, None, None, None
        await close_browser(browser, self.marker, self.config.close_timeout_s)
        if self._playwright_cm is not None:
            cm, self._playwright_cm, self._playwright = self._playwright_cm, None, None
            try:
                await asyncio.wait_for(cm.__aexit__(None, None, None), self.config.close_timeout_s)
            except Exception:  # noqa: BLE001 — the driver is gone already
                pass

    @property
    def browser_pid(self) -> int | None:
        """Returns the pid of this worker's browser process, or None when none is running."""
        pids = marked_pids(self.marker, exact=True)
        return pids[0] if pids else None

    @property
    def space(self) -> CoordinateSpace:
        """Returns the coordinate space actions are read in."""
        if self.config.coordinates == "relative":
            return RELATIVE
        w, h = self.suite.viewport
        scale = self.suite.device_scale_factor
        return CoordinateSpace.pixels(round(w * scale), round(h * scale))

    # --- episodes -----------------------------------------------------------------------
    async def reset(self, task: Any, seed: int = 0, request_id: str | None = None) -> Observation:
        """Starts `task` with `seed` and returns the first observation. With a tape (WorkerConfig.tape)
        the episode is recorded, or replayed, under `request_id` ("<task id>#<seed>" when None).

        Raises WorkerFault (after restarting the browser) when the browser crashes or hangs;
        DamagedRecording when the replayed recording is missing or damaged.
        """
        self._episode = None
        if self.config.tape is not None:
            # A suite serving its own pages (MiniWoB++: base_url) moves to a new port each run (web/recording.py).
            self._tape = TapeSession(self.config.tape, request_id or f"{_task_id(task)}#{seed}",
                                     getattr(self.suite, "base_url", None))
        return await self._guarded(self._reset(task, seed), self.config.reset_timeout_s, f"reset of {_task_id(task)}")

    async def finish_tape(self) -> tuple[Recording | None, str | None]:
        """Ends the episode's recording or replay (closing its context: Playwright writes the HAR then);
        returns (the Recording when recording, the first URL the recording did not hold when replaying).
        (None, None) without a tape. Raises WorkerFault when the browser fails meanwhile."""
        session, self._tape = self._tape, None
        if session is None or self._context is None:
            return None, None
        context, self._context, guard, self._guard = self._context, None, self._guard, None
        self._episode = None

        async def finish():
            if guard is not None:
                await guard.close()
            return await session.finish(context)

        recording = await self._guarded(finish(), self.config.reset_timeout_s, "saving the episode's recording")
        return recording, session.off_record

    async def step(self, action: Action) -> tuple[Observation, bool, dict[str, Any]]:
        """Performs `action` and returns (observation, done, info).

        info: reward, success, reason (from the suite), target (the action's SemanticTarget),
        error (the action's error or None), truncated (episode time limit reached).
        Raises EpisodeNotRunning outside an episode, WorkerFault on a crash or hang.
        """
        episode = self._episode
        if episode is None or episode.done:
            raise EpisodeNotRunning("step() needs a running episode: call reset() first"
                                    if episode is None else "the episode is done: call reset()")
        timeout = self.config.step_timeout_s + ((action.seconds or 1.0) if action.name == "wait" else 0.0)
        return await self._guarded(self._step(episode, action), timeout, f"step {episode.steps + 1} ({action.name})")

    async def _guarded(self, coro, timeout_s: float, what: str):
        self._phase = None
        try:
            return await asyncio.wait_for(coro, timeout_s)
        except asyncio.TimeoutError:
            reason = f"{what} timed out after {timeout_s:g}s" + (f" while {self._phase}" if self._phase else "")
        except EpisodeNotRunning:
            raise
        except EndpointDown as e:  # a reset's (re)connection found nobody there however often it tried
            self._drop()
            raise EndpointLost(self.endpoint, f"{what} failed: {e}") from e
        except Exception as e:  # noqa: BLE001 — any failure inside the browser is a fault
            reason = f"{what} failed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        self._episode = None
        if self.endpoint_down is not None:  # the pool gave this endpoint up: no reconnection
            self._drop()
            raise EndpointLost(self.endpoint, f"{reason}; {self.endpoint_down}")
        try:
            await self.restart()
        except EndpointDown as e:
            self._drop()
            raise EndpointLost(self.endpoint, f"{reason}; the reconnection failed: {e}") from e
        except Exception as e:  # noqa: BLE001 — the replacement died too: launch again on the next reset
            reason += f"; the relaunch failed too: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            self._drop()
        raise WorkerFault(reason)

    def _drop(self) -> None:
        # The browser is gone (or never came): the next reset launches or connects again.
        self._episode = None
        self._browser, self._context, self._guard = None, None, None
        kill_marked(self.marker, exact=True)

    async def _ensure_context(self, policy: RequestPolicy) -> None:
        if self._browser is None:
            await self.start()
        # A context's proxy (strict mode's WebSocket block) is fixed when it is created.
        fresh = (self._tape is not None or not self.suite.reuse_page or self._context is None or self._guard is None or not self._guard.pages
                 or policy.context_proxy() != self._guard.policy.context_proxy())
        if fresh:
            if self._guard is not None:
                await self._guard.close()
            if self._context is not None:
                await self._context.close()
            self._guard = None
            self._context = await self._browser.new_context(
                viewport={"width": self.suite.viewport[0], "height": self.suite.viewport[1]},
                device_scale_factor=self.suite.device_scale_factor, accept_downloads=False,
                proxy=policy.context_proxy(), **(self._tape.context_options() if self._tape else {}))
            if self._tape is not None:
                await self._tape.attach(self._context)
            self._guard = ContextGuard(self._context, policy, endpoint=self.endpoint)
            await self._guard.open_page()
        else:
            await self._guard.set_policy(policy)
            # Popups of the previous episode do not belong to this one.
            main = self._guard.pages[0]
            for page in self._guard.pages[1:]:
                await page.close()
            self._guard.active = main

    async def _reset(self, task: Any, seed: int) -> Observation:
        await self._ensure_context(self.suite.request_policy(task))
        guard = self._guard
        self._phase = f"opening {_task_id(task)} (seed {seed})"
        instruction = await self.suite.begin(guard.active, task, seed, self.config.reset_timeout_s)
        await guard.settle()
        self._phase = f"reading {guard.active.url} (screenshot, accessibility tree)"
        state = await self._read()
        obs = self._observation(state, instruction, step=0, action=None, error=None)
        self._episode = _Episode(task=task, seed=seed, instruction=instruction, started=time.monotonic(), last=obs)
        return obs

    async def _step(self, episode: _Episode, action: Action):
        before = episode.last
        action = action.with_target(resolve_target(action, before.elements, viewport=before.viewport,
                                                   focused_id=before.focused_id, space=self.space))
        guard = self._guard
        page = guard.active
        error = None
        self._phase = f"performing the {action.name} on {page.url}"
        try:
            await execute_action(page, action, viewport=self.suite.viewport, space=self.space, policy=guard.policy,
                                 navigation_timeout_s=self.config.navigation_timeout_s)
        except ActionFailed as e:
            error = str(e)
        if self._dead or guard.crashed:
            raise RuntimeError("browser disconnected or page crashed during the action")
        if self.suite.settle_s > 0 and action.name not in ("wait", "answer"):
            await asyncio.sleep(self.suite.settle_s)
        self._phase = "choosing the page to observe"
        await guard.settle()
        self._phase = f"reading {guard.active.url} (screenshot, accessibility tree)"
        state = await self._read()
        # After the read, so the error and the observation's blocked_urls report the same events.
        if guard.log.blocked_navigations and error is None:
            error = f"navigation blocked: {guard.log.blocked_urls[-1]}"
        episode.steps += 1
        obs = self._observation(state, episode.instruction, step=episode.steps, action=action, error=error)
        status = self.suite.status(episode.task, state.status_value, action if action.name == "answer" else None)
        truncated = (self.config.episode_timeout_s is not None and not status.done
                     and time.monotonic() - episode.started > self.config.episode_timeout_s)
        episode.last = obs
        episode.done = status.done or truncated
        info = {"reward": status.reward, "success": status.success,
                "reason": "episode time limit" if truncated else status.reason,
                "target": action.target, "error": error, "truncated": truncated}
        return obs, episode.done, info

    async def _read(self):
        guard = self._guard
        page = guard.active
        cdp = await guard.session(page)
        for attempt in range(1, _READ_ATTEMPTS + 1):
            try:
                return await read_page(page, cdp, viewport=self.suite.viewport, status_script=self.suite.status_script,
                                       fast_png=self.config.fast_png)
            except PlaywrightError as e:
                if attempt < _READ_ATTEMPTS and not self._dead and page.is_closed() and guard.active is not page:
                    # The page closed itself (window.close()) while we read it: read the one
                    # that took over.
                    page = guard.active
                    cdp = await guard.session(page)
                    continue
                # A navigation under way destroys the page's JS context or briefly leaves no
                # frame to capture: let it land and read again.
                message = str(e).lower()
                if (attempt == _READ_ATTEMPTS or self._dead or page.is_closed()
                        or not any(m in message for m in _NAVIGATION_RACES)):
                    raise
                try:
                    await page.wait_for_load_state("domcontentloaded", timeout=self.config.navigation_timeout_s * 1000)
                except PlaywrightError:
                    pass
                await asyncio.sleep(0.05 * attempt)  # the new document's first frame
                if "not attached" in message and attempt >= 2:
                    cdp = await self._guard.reattach(page)

    def _observation(self, state, instruction: str, *, step: int, action: Action | None, error: str | None) -> Observation:
        return Observation(
            url=state.url, title=state.title, screenshot=state.screenshot, viewport=tuple(self.suite.viewport),
            screenshot_size=state.screenshot_size, elements=state.elements, focused_id=state.focused_id,
            instruction=instruction, step=step, last_action=action, last_error=error,
            coordinates=self.config.coordinates, **self._guard.log.drain())


def _task_id(task: Any) -> str:
    return str(getattr(task, "id", task))
