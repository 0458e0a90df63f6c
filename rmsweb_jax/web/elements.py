"""Page elements (id, role, accessible name, box) and the pure point -> element lookup.

The lookup runs the same way live (on the observation just read) and offline (on a stored
observation), so Salvage-DS can compare a sampled action with a reference action by meaning.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Iterable, Sequence

from rmsweb_jax.web.normalize import normalize_text

# Roles a user acts on; a click inside one of these means "this control", whatever text or icon
# inside it the point happened to land on.
INTERACTIVE_ROLES = frozenset({
    "button", "link", "checkbox", "radio", "textbox", "searchbox", "combobox", "listbox", "option",
    "menuitem", "menuitemcheckbox", "menuitemradio", "tab", "switch", "slider", "spinbutton",
    "treeitem", "gridcell", "columnheader", "rowheader", "row", "menu", "menubar", "scrollbar",
    "ListBoxOption", "MenuListOption", "MenuListPopup", "PopUpButton", "ToggleButton", "DisclosureTriangle",
    "Date", "DateTime", "InputTime", "ColorWell",
})
# Roles where the point inside the element carries meaning (where on the canvas, which pixel of
# the image): two clicks on one of these are the same only when the points are close too.
SPATIAL_ROLES = frozenset({"Canvas", "canvas", "img", "image", "graphics-document", "application", "Svg", "SvgRoot", "figure"})


@dataclasses.dataclass(frozen=True)
class BBox:
    """An axis-aligned box in CSS pixels of the viewport (x, y of the top-left corner)."""

    x: float
    y: float
    width: float
    height: float

    @property
    def area(self) -> float:
        """Returns width * height."""
        return self.width * self.height

    @property
    def center(self) -> tuple[float, float]:
        """Returns the centre point (x, y)."""
        return (self.x + self.width / 2, self.y + self.height / 2)

    def contains(self, x: float, y: float) -> bool:
        """Returns whether the point lies inside the box (edges included)."""
        return self.x <= x <= self.x + self.width and self.y <= y <= self.y + self.height

    def close_to(self, other: "BBox", tolerance: float = 2.0) -> bool:
        """Returns whether every edge of `other` is within `tolerance` pixels of this box's."""
        return (abs(self.x - other.x) <= tolerance and abs(self.y - other.y) <= tolerance
                and abs(self.width - other.width) <= tolerance and abs(self.height - other.height) <= tolerance)

    def to_list(self) -> list[float]:
        """Returns [x, y, width, height] rounded to 1/100 pixel."""
        return [round(v, 2) for v in (self.x, self.y, self.width, self.height)]

    @classmethod
    def from_list(cls, values: Sequence[float]) -> "BBox":
        """Returns the box for [x, y, width, height]; raises ValueError for any other shape."""
        if len(values) != 4:
            raise ValueError(f"bbox must be [x, y, width, height], got {values!r}")
        return cls(*(float(v) for v in values))


@dataclasses.dataclass(frozen=True)
class Element:
    """One visible element of the page, as the accessibility tree names it.

    `id` is Chromium's backend DOM node id: stable while the page lives, not across reloads.
    `z` is Chromium's paint order (higher is painted later, i.e. on top). `owner` is the id of
    the control a click on this element acts on: its nearest interactive ancestor (the button a
    label sits in), or for a native <label> and the text in it, the control it labels (the
    checkbox of `<label for=...>`), or None. `url` is a link's resolved destination ("" for
    anything else). `states` are the accessibility states a user sees ("checked", "selected",
    "expanded", "collapsed", "disabled"), in that order.
    """

    id: int
    role: str
    name: str
    bbox: BBox
    value: str = ""
    focusable: bool = False
    z: int = 0
    owner: int | None = None
    url: str = ""
    states: tuple[str, ...] = ()

    @property
    def interactive(self) -> bool:
        """Returns whether a user would act on this element itself (a control, not its text)."""
        return self.role in INTERACTIVE_ROLES or (self.focusable and self.role not in ("RootWebArea", "generic"))

    def to_dict(self) -> dict[str, Any]:
        """Returns a JSON-ready dict."""
        return {"id": self.id, "role": self.role, "name": self.name, "bbox": self.bbox.to_list(),
                "value": self.value, "focusable": self.focusable, "z": self.z, "owner": self.owner, "url": self.url,
                **({"states": list(self.states)} if self.states else {})}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Element":
        """Returns the element stored by `to_dict`; raises KeyError naming a missing key."""
        return cls(id=int(d["id"]), role=str(d["role"]), name=str(d["name"]), bbox=BBox.from_list(d["bbox"]),
                   value=str(d.get("value", "")), focusable=bool(d.get("focusable", False)), z=int(d.get("z", 0)),
                   owner=None if d.get("owner") is None else int(d["owner"]), url=str(d.get("url", "")),
                   states=tuple(str(s) for s in d.get("states", ())))


def element_at(elements: Sequence[Element], x: float, y: float) -> Element | None:
    """Returns the element a click at (x, y) acts on, or None when no listed element is there.

    The element painted on top at the point (the smallest one among equals) is the one hit; when
    that is text or an icon inside a control, the control is returned instead (its `owner`, or
    an interactive element painted at the same level). So a click on a button's label and a click
    on its padding both land on the button, a click on a checkbox's <label> lands on the checkbox
    (wherever it is: the browser forwards the click), and a dialog's button wins over the button
    it covers.
    """
    hits = [e for e in elements if e.bbox.contains(x, y)]
    if not hits:
        return None
    top = min(hits, key=lambda e: (-e.z, e.bbox.area))
    if top.interactive:
        return top
    owner = element_by_id(elements, top.owner)
    if owner is not None:
        return owner
    level = [e for e in hits if e.interactive and e.z == top.z]
    return min(level, key=lambda e: e.bbox.area) if level else top


def element_by_id(elements: Iterable[Element], element_id: int | None) -> Element | None:
    """Returns the element with `element_id`, or None."""
    if element_id is None:
        return None
    return next((e for e in elements if e.id == element_id), None)


def same_element(a: Element, b: Element, tolerance: float = 2.0) -> bool:
    """Returns whether two elements are the same thing on screen: same role, same normalized
    name, boxes within `tolerance` pixels. Ids are ignored so that elements read in two runs of
    the same page (whose node ids differ) still match."""
    return a.role == b.role and normalize_text(a.name) == normalize_text(b.name) and a.bbox.close_to(b.bbox, tolerance)
