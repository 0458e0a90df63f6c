"""The ceiling for env steps/s: a bare Playwright loop doing what a worker step does (click,
screenshot, accessibility tree + layout boxes joined into an element list, done flag), with no
records, safety rules, semantic targets or fault handling."""
from __future__ import annotations

import asyncio
import base64
import time

from playwright.async_api import async_playwright

from bench.env_plan import MAX_STEPS, click_point
from rmsweb_jax.web.browser import CHROMIUM_FLAGS, find_chromium

_INTERACTIVE = {"button", "link", "checkbox", "radio", "textbox", "combobox", "listbox", "option", "tab", "menuitem"}
_START = "([seed]) => { Math.seedrandom(seed); core.startEpisodeReal(); return core.getUtterance(); }"


async def _observe(page, cdp):
    # The ceiling takes the same shortcut as the worker: CDP results without Playwright's
    # object-mapping walk (see rmsweb_jax.web.page_reader.cdp_send).
    send = cdp._impl_obj.send
    shot, ax, snap, done = await asyncio.gather(
        send(method="Page.captureScreenshot", params={"format": "png", "optimizeForSpeed": True}, timeout=None),
        send(method="Accessibility.getFullAXTree", params=None, timeout=None),
        send(method="DOMSnapshot.captureSnapshot", params={"computedStyles": [], "includePaintOrder": True},
             timeout=None),
        page.evaluate("WOB_DONE_GLOBAL"),
    )
    png = base64.b64decode(shot["data"])
    doc = snap["documents"][0]
    backend = doc["nodes"]["backendNodeId"]
    boxes = {backend[i]: box for i, box in zip(doc["layout"]["nodeIndex"], doc["layout"]["bounds"])}
    elements = []
    for node in ax["nodes"]:
        box = boxes.get(node.get("backendDOMNodeId"))
        role = node.get("role", {}).get("value")
        name = (node.get("name") or {}).get("value") or ""
        if box and not node.get("ignored") and box[2] * box[3] > 0 and (name.strip() or role in _INTERACTIVE):
            elements.append((role, name, box))
    return png, elements, done


async def run_bare_loop(base_url: str, workers: int, plan: list[tuple[int, str, int]],
                        viewport: tuple[int, int] = (500, 240), warmup: list[tuple[int, str, int]] = ()
                        ) -> tuple[int, float]:
    """Returns (steps, wall seconds) for running `plan` on `workers` browsers in one process,
    after an untimed `warmup` plan (one step per episode)."""
    async with async_playwright() as p:
        browsers = await asyncio.gather(*(p.chromium.launch(executable_path=find_chromium(), args=list(CHROMIUM_FLAGS))
                                          for _ in range(workers)))
        pages = []
        for browser in browsers:
            context = await browser.new_context(viewport={"width": viewport[0], "height": viewport[1]})
            page = await context.new_page()
            pages.append((page, await context.new_cdp_session(page)))
        queue: list = []
        steps = [0] * workers

        async def loop(slot: int, max_steps: int) -> None:
            page, cdp = pages[slot]
            while queue:
                index, task, seed = queue.pop()
                url = f"{base_url}miniwob/{task}.html"
                if page.url != url:
                    await page.goto(url, wait_until="load")
                await page.evaluate(_START, [seed])
                await _observe(page, cdp)
                for step in range(max_steps):
                    await page.mouse.click(*click_point(index, step))
                    _, _, done = await _observe(page, cdp)
                    steps[slot] += 1
                    if done:
                        break

        queue.extend(reversed(warmup))
        await asyncio.gather(*(loop(i, 1) for i in range(workers)))
        queue.extend(reversed(plan))
        steps[:] = [0] * workers
        started = time.perf_counter()
        await asyncio.gather(*(loop(i, MAX_STEPS) for i in range(workers)))
        wall = time.perf_counter() - started
        await asyncio.gather(*(b.close() for b in browsers))
    return sum(steps), wall
