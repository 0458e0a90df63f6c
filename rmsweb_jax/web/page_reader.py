"""One observation of a page in one round trip: screenshot, element list, title, suite status."""
from __future__ import annotations

import asyncio
import base64
import dataclasses
import struct
from typing import Any

from rmsweb_jax.web.ax_tree import elements_from_cdp
from rmsweb_jax.web.elements import Element


@dataclasses.dataclass(frozen=True)
class PageState:
    """What read_page returns: the raw parts of an Observation plus the suite's status value."""

    url: str
    title: str
    screenshot: bytes
    screenshot_size: tuple[int, int]
    elements: tuple[Element, ...]
    focused_id: int | None
    status_value: Any


def png_size(png: bytes) -> tuple[int, int]:
    """Returns (width, height) from a PNG's IHDR header."""
    if len(png) < 24 or png[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError(f"not a PNG: {png[:8]!r}")
    return struct.unpack(">II", png[16:24])


def cdp_send(cdp, method: str, params: dict | None = None):
    """Returns the awaitable result of one CDP command.

    Playwright's public CDPSession.send walks every result through its object mapping (about
    half the Python time of an observation, for the large tree and snapshot results); its
    implementation object returns the same plain dict without that walk. Falls back to the
    public call if the implementation's signature ever changes.
    """
    impl = getattr(cdp, "_impl_obj", None)
    if impl is not None:
        try:
            return impl.send(method=method, params=params, timeout=None)
        except TypeError:
            pass
    return cdp.send(method, params)


async def read_page(page, cdp, *, viewport: tuple[int, int], status_script: str = "null",
                    fast_png: bool = True) -> PageState:
    """Returns the page's screenshot, visible elements, focus, title and status value.

    The four requests (screenshot, accessibility tree, DOM snapshot, one evaluate) go out
    together, so an observation costs about one round trip.
    """
    shot, ax, snap, evaluated = await asyncio.gather(
        cdp_send(cdp, "Page.captureScreenshot", {"format": "png", "optimizeForSpeed": fast_png}),
        cdp_send(cdp, "Accessibility.getFullAXTree"),
        cdp_send(cdp, "DOMSnapshot.captureSnapshot", {"computedStyles": [], "includePaintOrder": True}),
        page.evaluate(_EVALUATE.replace("__STATUS__", status_script)),
    )
    png = base64.b64decode(shot["data"])
    elements, focused = elements_from_cdp(ax["nodes"], snap, viewport)
    title, status = evaluated
    return PageState(url=page.url, title=title, screenshot=png, screenshot_size=png_size(png),
                     elements=elements, focused_id=focused, status_value=status)


# A page may lack the suite's globals (an error page, a half-loaded document): report null.
_EVALUATE = """() => {
  let status = null;
  try { status = (__STATUS__); } catch (e) { status = null; }
  return [document.title, status];
}"""
