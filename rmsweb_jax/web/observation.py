"""The Observation record: what the agent sees after a reset or a step."""
from __future__ import annotations

import base64
import dataclasses
import json
from typing import Any, Mapping

from rmsweb_jax.web.actions import RELATIVE, Action, CoordinateSpace
from rmsweb_jax.web.elements import Element, element_by_id


@dataclasses.dataclass(frozen=True)
class Observation:
    """One observation of the active page.

    `screenshot` is PNG bytes of the viewport (`screenshot_size` pixels; `viewport` is the CSS
    size, they differ by the device scale factor). `elements` are the visible elements with
    role, accessible name and box in viewport CSS pixels. `coordinates` ("relative" or "pixel")
    says how actions on this observation read their coordinates. The event fields list what
    happened since the previous observation: dialogs dismissed, requests blocked by the task's
    allowlist, downloads refused, popups followed.
    """

    url: str
    title: str
    screenshot: bytes
    viewport: tuple[int, int]
    screenshot_size: tuple[int, int]
    elements: tuple[Element, ...]
    focused_id: int | None
    instruction: str
    step: int = 0
    last_action: Action | None = None
    last_error: str | None = None
    dialogs: tuple[str, ...] = ()
    blocked_urls: tuple[str, ...] = ()
    refused_downloads: tuple[str, ...] = ()
    popups: tuple[str, ...] = ()
    coordinates: str = "relative"

    @property
    def focused(self) -> Element | None:
        """Returns the focused element, or None when the page itself has focus."""
        return element_by_id(self.elements, self.focused_id)

    @property
    def coordinate_space(self) -> CoordinateSpace:
        """Returns the coordinate space actions on this observation use."""
        return RELATIVE if self.coordinates == "relative" else CoordinateSpace.pixels(*self.screenshot_size)

    def to_dict(self) -> dict[str, Any]:
        """Returns a JSON-ready dict (the screenshot base64-encoded)."""
        return {
            "url": self.url, "title": self.title, "screenshot": base64.b64encode(self.screenshot).decode("ascii"),
            "viewport": list(self.viewport), "screenshot_size": list(self.screenshot_size),
            "elements": [e.to_dict() for e in self.elements], "focused_id": self.focused_id,
            "instruction": self.instruction, "step": self.step,
            "last_action": None if self.last_action is None else self.last_action.to_dict(),
            "last_error": self.last_error, "dialogs": list(self.dialogs), "blocked_urls": list(self.blocked_urls),
            "refused_downloads": list(self.refused_downloads), "popups": list(self.popups),
            "coordinates": self.coordinates,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Observation":
        """Returns the observation stored by `to_dict`; raises KeyError naming a missing key."""
        return cls(
            url=d["url"], title=d["title"], screenshot=base64.b64decode(d["screenshot"]),
            viewport=tuple(d["viewport"]), screenshot_size=tuple(d["screenshot_size"]),
            elements=tuple(Element.from_dict(e) for e in d["elements"]), focused_id=d["focused_id"],
            instruction=d["instruction"], step=d.get("step", 0),
            last_action=None if d.get("last_action") is None else Action.from_dict(d["last_action"]),
            last_error=d.get("last_error"), dialogs=tuple(d.get("dialogs", ())),
            blocked_urls=tuple(d.get("blocked_urls", ())), refused_downloads=tuple(d.get("refused_downloads", ())),
            popups=tuple(d.get("popups", ())), coordinates=d.get("coordinates", "relative"),
        )

    def to_json(self) -> str:
        """Returns `to_dict()` as a JSON string."""
        return json.dumps(self.to_dict(), ensure_ascii=False)

    @classmethod
    def from_json(cls, text: str) -> "Observation":
        """Returns the observation stored by `to_json`."""
        return cls.from_dict(json.loads(text))
