"""Per-context side effects: request blocking, dialogs, downloads, popups, crashes.

The guard watches a browser context, enforces its RequestPolicy, and keeps a log of what
happened since the last observation; the worker drains it into each Observation.

Requests are checked with CDP's Fetch domain rather than with Playwright's routes: routes send
every request through the driver and Python and switch the HTTP cache off, which doubles the
cost of a MiniWoB page load; Fetch pauses only what the policy must see (documents only, unless
sub-resources are checked too) and keeps the cache. Fetch runs on a browser-level session, not
on each page's: a page session exists only after Playwright reports the page, by which time a
popup (window.open, target=_blank) has already sent its first request; the browser-level
interceptor holds every request of every page, frame and worker from the first. WebSocket
handshakes bypass Fetch altogether; in strict mode the context's proxy refuses them
(RequestPolicy.context_proxy), so a worker must create each context with that proxy.

Which page the agent acts on is decided once per step, in settle(): the newest page that shows
an allowlisted document. A popup that is still blank (its navigation pending, or blocked) is
not one; a page that shows a document off the allowlist is closed (a popup) or sent back.
"""
from __future__ import annotations

import asyncio
import dataclasses

from playwright.async_api import Error as PlaywrightError

from rmsweb_jax.web.page_reader import cdp_send
from rmsweb_jax.web.safety import RequestPolicy

_LOCAL_RESOURCE = "Not allowed to load local resource:"
# The open guards of each remote endpoint in this process (a shared browser): whose frame a request is.
_GUARDS_ON_ENDPOINT: dict[str, set] = {}
_BLANK = ("about:blank", "")


@dataclasses.dataclass
class EventLog:
    """Events since the last drain (mutable; owned by one worker)."""

    dialogs: list[str] = dataclasses.field(default_factory=list)
    blocked_urls: list[str] = dataclasses.field(default_factory=list)
    refused_downloads: list[str] = dataclasses.field(default_factory=list)
    popups: list[str] = dataclasses.field(default_factory=list)
    blocked_navigations: int = 0

    def drain(self) -> dict[str, tuple[str, ...]]:
        """Returns the events as tuples keyed like Observation's fields, and clears the log."""
        out = {k: tuple(getattr(self, k)) for k in ("dialogs", "blocked_urls", "refused_downloads", "popups")}
        for v in (self.dialogs, self.blocked_urls, self.refused_downloads, self.popups):
            v.clear()
        self.blocked_navigations = 0
        return out


class ContextGuard:
    """Enforces `policy` on a context's pages and follows them.

    `active` is the page actions go to, chosen by settle() after each action; when the active
    page closes, the most recent open page takes over. `crashed` turns True when any page's
    renderer crashes. `session(page)` is the page's CDP session (used for observations).
    The context must carry `policy.context_proxy()`. The interceptor sees the whole browser: with
    `shared_browser` False the context must be its browser's only one while the guard is open. A remote
    browser (web.cdp_endpoint) is shared by every worker the pool gives its endpoint, each with its own
    context and policy, and every guard's interceptor pauses every context's requests: there (`endpoint`
    names it) each guard judges only its own context's requests and lets the others' go on to their own
    guard (_owner says whose a request is; one it cannot place is judged, so that nothing of its own slips
    through).
    """

    def __init__(self, context, policy: RequestPolicy, *, endpoint: str | None = None):
        self.context = context
        self.policy = policy
        self.endpoint = endpoint
        self.shared_browser = endpoint is not None
        self._context_id: str | None = None  # CDP's browserContextId of `context` (shared browser)
        # Shared browser: targetId -> browserContextId of every live target (a page's main frame is its target)...
        self._target_contexts: dict[str, str] = {}
        # ... and frameId -> browserContextId of the subframes placed this episode, so that a subframe's page trees
        # are read once, at its first request (cleared by set_policy: a frame's id is never reused)
        self._frame_contexts: dict[str, str] = {}
        self.log = EventLog()
        self.pages: list = []
        self.active = None
        self.crashed = False
        self._interceptor = None
        self._sessions: dict = {}
        self._attaching: dict = {}
        self._tasks: set = set()
        context.on("page", self._on_page)

    async def open_page(self):
        """Starts intercepting the browser's requests, then opens the context's first page,
        guarded, and returns it."""
        if self._interceptor is None:
            session = await self.context.browser.new_browser_cdp_session()
            if self.shared_browser:
                session.on("Target.targetCreated", self._on_target)
                session.on("Target.targetInfoChanged", self._on_target)
                session.on("Target.targetDestroyed", lambda event: self._target_contexts.pop(event["targetId"], None))
                await cdp_send(session, "Target.setDiscoverTargets", {"discover": True})
            session.on("Fetch.requestPaused", lambda event: self._spawn(self._on_paused(session, event)))
            await cdp_send(session, "Fetch.enable", {"patterns": self._patterns()})
            self._interceptor = session
        page = await self.context.new_page()
        cdp = await self.session(page)
        if self.shared_browser and self._context_id is None:
            self._context_id = (await cdp_send(cdp, "Target.getTargetInfo", {}))["targetInfo"]["browserContextId"]
            _GUARDS_ON_ENDPOINT.setdefault(self.endpoint, set()).add(self)
        return page

    async def close(self) -> None:
        """Stops intercepting (before the context closes, so that the next context's guard is
        the browser's only interceptor)."""
        _GUARDS_ON_ENDPOINT.get(self.endpoint, set()).discard(self)
        session, self._interceptor = self._interceptor, None
        if session is not None:
            await session.detach()

    async def session(self, page):
        """Returns `page`'s CDP session, attaching the guard to the page first if needed."""
        if page not in self._sessions:
            if page not in self._attaching:
                self._attaching[page] = asyncio.ensure_future(self._attach(page))
            await self._attaching[page]
        return self._sessions[page]

    async def reattach(self, page):
        """Returns a fresh CDP session for `page` (after the old one lost its target)."""
        self._sessions.pop(page, None)
        return await self.session(page)

    async def _attach(self, page) -> None:
        if page not in self.pages:
            self._watch(page)
        self._sessions[page] = await self.context.new_cdp_session(page)
        self._attaching.pop(page, None)

    async def set_policy(self, policy: RequestPolicy) -> None:
        """Switches to another task's policy (between episodes)."""
        widen = policy.check_subresources != self.policy.check_subresources
        self.policy = policy
        self._frame_contexts.clear()  # the last episode's frames are gone
        if widen and self._interceptor is not None:
            await cdp_send(self._interceptor, "Fetch.enable", {"patterns": self._patterns()})

    def _patterns(self) -> list[dict]:
        pattern = {"urlPattern": "*", "requestStage": "Request"}
        return [pattern if self.policy.check_subresources else {**pattern, "resourceType": "Document"}]

    def _on_target(self, event) -> None:
        info = event["targetInfo"]
        if info.get("browserContextId"):
            self._target_contexts[info["targetId"]] = info["browserContextId"]

    async def _owner(self, session, frame_id: str | None) -> str | None:
        """Returns the browserContextId whose page or frame `frame_id` is (None: it cannot be placed). A page's
        main frame is its target; a frame inside a page is looked up in the pages of this process's guards
        on the same endpoint."""
        for placed in (self._target_contexts, self._frame_contexts):
            if frame_id in placed:
                return placed[frame_id]
        for guard in [self, *(g for g in _GUARDS_ON_ENDPOINT.get(self.endpoint, ()) if g is not self)]:
            if await guard._shows_frame(frame_id):
                if frame_id is not None and guard._context_id is not None:
                    self._frame_contexts[frame_id] = guard._context_id
                return guard._context_id
        for info in (await cdp_send(session, "Target.getTargets", {}))["targetInfos"]:  # a target not yet announced
            self._on_target({"targetInfo": info})
        return self._target_contexts.get(frame_id)

    async def _shows_frame(self, frame_id: str | None) -> bool:
        """Returns whether one of this guard's pages holds frame `frame_id`."""
        for cdp in list(self._sessions.values()):
            try:
                tree = (await cdp_send(cdp, "Page.getFrameTree", {}))["frameTree"]
            except PlaywrightError:
                continue  # that page went away
            stack = [tree]
            while stack:
                node = stack.pop()
                if node["frame"]["id"] == frame_id:
                    return True
                stack.extend(node.get("childFrames", ()))
        return False

    async def _judges(self, session, frame_id: str | None) -> bool:
        """Returns whether this guard judges a request of `frame_id` in a shared browser: its own context's, and
        one that cannot be placed; not another context's (its own guard judges it), nor any before this
        guard's context has a page (none of those is its own)."""
        if self._context_id is None:
            return False
        owner = await self._owner(session, frame_id)
        return owner is None or owner == self._context_id

    async def _on_paused(self, session, event) -> None:
        url, kind = event["request"]["url"], event.get("resourceType", "Other")
        try:
            if self.shared_browser and not await self._judges(session, event.get("frameId")):
                await cdp_send(session, "Fetch.continueRequest", {"requestId": event["requestId"]})
                return
        except PlaywrightError:
            return  # the request or the browser session went away meanwhile
        reason = self.policy.blocked_reason(url, kind.lower())
        try:
            if reason is None:
                await cdp_send(session, "Fetch.continueRequest", {"requestId": event["requestId"]})
            elif kind == "Document":
                # A 204 answer cancels a navigation and leaves the page where it was (failing it
                # would commit Chromium's error page instead).
                self.log.blocked_urls.append(url)
                self.log.blocked_navigations += 1
                await cdp_send(session, "Fetch.fulfillRequest",
                               {"requestId": event["requestId"], "responseCode": 204, "body": ""})
            else:
                self.log.blocked_urls.append(url)
                await cdp_send(session, "Fetch.failRequest", {"requestId": event["requestId"], "errorReason": "BlockedByClient"})
        except PlaywrightError:
            pass  # the page (or the browser session) went away while the request was paused: nothing to answer

    def _spawn(self, coro) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _watch(self, page) -> None:
        self.pages.append(page)
        if self.active is None:
            self.active = page
        page.on("dialog", self._on_dialog)
        page.on("download", self._on_download)
        page.on("crash", self._on_crash)
        page.on("close", self._on_close)
        page.on("console", self._on_console)

    async def _on_dialog(self, dialog) -> None:
        self.log.dialogs.append(f"{dialog.type}: {dialog.message}")
        try:
            await dialog.dismiss()
        except PlaywrightError:
            pass  # the dialog was already handled, or its page closed: it no longer blocks anything

    async def _on_download(self, download) -> None:
        # The context refuses downloads (accept_downloads=False); cancel explicitly in case.
        self.log.refused_downloads.append(download.url)
        try:
            await download.cancel()
        except PlaywrightError:
            pass  # the download already ended (the context refused it) or its page closed: nothing to cancel

    def _on_console(self, message) -> None:
        # Chromium itself refuses file:// links from web pages; it only says so on the console.
        if message.type == "error" and message.text.startswith(_LOCAL_RESOURCE):
            self.log.blocked_urls.append(message.text[len(_LOCAL_RESOURCE):].strip())

    def _on_crash(self, page) -> None:
        self.crashed = True

    def _on_page(self, page) -> None:
        if page in self.pages or not self.pages:
            return  # the first page, opened by open_page
        self._watch(page)
        self.log.popups.append(page.url)

    async def settle(self) -> None:
        """Chooses the page the agent sees and acts on next: the newest page showing an
        allowlisted document (the first page when none does). A page showing a document off the
        allowlist (none should: its request was blocked) is closed, or for the first page,
        emptied."""
        for page in list(self.pages):
            if page.is_closed() or self.policy.blocked_reason(page.url, "document") is None:
                continue
            self.log.blocked_urls.append(page.url)
            if page is self.pages[0]:
                await page.goto("about:blank")
            else:
                await page.close()
        self._choose_active()

    def _choose_active(self) -> None:
        open_pages = [p for p in self.pages if not p.is_closed()]
        if open_pages:
            shown = [p for p in open_pages if p.url not in _BLANK]
            self.active = shown[-1] if shown else open_pages[0]

    def _on_close(self, page) -> None:
        if page in self.pages:
            self.pages.remove(page)
        self._sessions.pop(page, None)
        if page is self.active:
            self._choose_active()
