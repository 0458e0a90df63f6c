"""Carrying out one Action on a Playwright page."""
from __future__ import annotations

import asyncio

from playwright.async_api import Error as PlaywrightError

from rmsweb_jax.web.actions import Action, CoordinateSpace
from rmsweb_jax.web.normalize import key_combo
from rmsweb_jax.web.safety import RequestPolicy

DEFAULT_WAIT_S = 1.0


class ActionFailed(Exception):
    """The action could not be carried out on a healthy page (the agent's mistake, not the
    browser's): it is reported in the next observation's `last_error`."""


async def execute_action(page, action: Action, *, viewport: tuple[int, int], space: CoordinateSpace,
                         policy: RequestPolicy, navigation_timeout_s: float = 10.0) -> None:
    """Performs `action` on `page`; returns when the input has been delivered.

    Raises ActionFailed for mistakes the page survives (a blocked URL, no page to go back to,
    a navigation error); Playwright errors from a dead page or browser propagate.
    """
    name = action.name
    point = None if action.coordinate is None else space.to_css(action.coordinate, viewport)
    if name == "left_click":
        await page.mouse.click(*point)
    elif name == "double_click":
        await page.mouse.dblclick(*point)
    elif name == "hover":
        await page.mouse.move(*point)
    elif name == "type":
        if point is not None:
            await page.mouse.click(*point)
        if action.clear:
            await page.keyboard.press("Control+a")
            await page.keyboard.press("Backspace")
        if action.text:
            await page.keyboard.type(action.text)
        if action.press_enter:
            await page.keyboard.press("Enter")
    elif name == "key":
        await page.keyboard.press(key_combo(action.keys))
    elif name == "scroll":
        x, y = point if point is not None else (viewport[0] / 2, viewport[1] / 2)
        await page.mouse.move(x, y)
        step = float(action.amount)
        dx, dy = {"up": (0, -step), "down": (0, step), "left": (-step, 0), "right": (step, 0)}[action.direction]
        await page.mouse.wheel(dx, dy)
    elif name == "go_back":
        before = page.url
        response = await _navigation(page.go_back(timeout=navigation_timeout_s * 1000, wait_until="commit"))
        if response is None and page.url == before:
            raise ActionFailed("go_back: there is no previous page")
    elif name == "navigate":
        url = action.url.strip()
        if "://" not in url and not url.startswith(("about:", "data:")):
            url = "https://" + url
        reason = policy.blocked_reason(url, "document")
        if reason is not None:
            raise ActionFailed(f"navigate blocked: {reason}")
        await _navigation(page.goto(url, timeout=navigation_timeout_s * 1000, wait_until="domcontentloaded"))
    elif name == "wait":
        await asyncio.sleep(DEFAULT_WAIT_S if action.seconds is None else action.seconds)
    elif name == "answer":
        pass  # ends the episode; the suite reads the answer
    else:  # Action validates names, so this is a programming error
        raise ValueError(f"unknown action {name!r}")


async def _navigation(awaitable):
    # Navigation errors (DNS, timeouts, blocked requests) are the agent's outcome to see, not a
    # browser fault; a closed page or browser still propagates.
    try:
        return await awaitable
    except PlaywrightError as e:
        message = str(e).splitlines()[0]
        if "closed" in message.lower() or "crash" in message.lower():
            raise
        raise ActionFailed(message) from None
