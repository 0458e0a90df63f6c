"""Element lists from Chromium's accessibility tree plus a DOM snapshot's layout boxes (pure)."""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

from rmsweb_jax.web.elements import BBox, Element
from rmsweb_jax.web.normalize import normalize_text

# Nodes that are never elements of their own: text fragments, line breaks, the document.
_SKIP_ROLES = frozenset({"InlineTextBox", "LineBreak", "none", "presentation", "RootWebArea", "WebArea",
                         "Iframe", "IframePresentational", "ignored"})


def layout_boxes(snapshot: Mapping[str, Any]) -> dict[int, tuple[BBox, int]]:
    """Returns backend node id -> (box in viewport CSS pixels, paint order) for the main
    document of a `DOMSnapshot.captureSnapshot` result (taken with includePaintOrder)."""
    if not snapshot.get("documents"):
        return {}
    doc = snapshot["documents"][0]
    backend = doc["nodes"]["backendNodeId"]
    layout = doc["layout"]
    paint = layout.get("paintOrders") or [0] * len(layout["nodeIndex"])
    sx, sy = doc.get("scrollOffsetX", 0.0), doc.get("scrollOffsetY", 0.0)
    boxes: dict[int, tuple[BBox, int]] = {}
    for node_index, (x, y, w, h), z in zip(layout["nodeIndex"], layout["bounds"], paint):
        key = backend[node_index]
        box = BBox(x - sx, y - sy, w, h)
        if key in boxes:  # one node laid out in several boxes (wrapped inline): take the union
            old, oz = boxes[key]
            x0, y0 = min(old.x, box.x), min(old.y, box.y)
            x1 = max(old.x + old.width, box.x + box.width)
            y1 = max(old.y + old.height, box.y + box.height)
            box, z = BBox(x0, y0, x1 - x0, y1 - y0), max(oz, z)
        boxes[key] = (box, z)
    return boxes


def elements_from_cdp(ax_nodes: Sequence[Mapping[str, Any]], snapshot: Mapping[str, Any],
                      viewport: tuple[int, int]) -> tuple[tuple[Element, ...], int | None]:
    """Returns (visible elements in document order, id of the focused element or None) from an
    `Accessibility.getFullAXTree` node list and a `DOMSnapshot.captureSnapshot` result.

    An element is a non-ignored node with a box inside the viewport that is interactive or has
    a name; text that only repeats the name of the element it sits in is left out. Native
    <label>s are kept as "LabelText" elements owned by the control they label, even when
    Chromium ignores them (it does once their text has become the control's name), so that a
    click on a label resolves to its control.
    """
    boxes = layout_boxes(snapshot)
    vw, vh = viewport
    by_ax_id = {n["nodeId"]: n for n in ax_nodes}
    labels = _native_labels(ax_nodes)
    candidates: dict[str, Element] = {}
    focused_ax = None
    for node in ax_nodes:
        backend = node.get("backendDOMNodeId")
        label = labels.get(backend) if backend is not None else None
        if node.get("ignored") and label is None:
            continue
        props = {p["name"]: p.get("value", {}).get("value") for p in node.get("properties") or ()}
        role = "LabelText" if label is not None else _value(node.get("role"))
        if props.get("focused") and role not in ("RootWebArea", "WebArea"):
            focused_ax = node["nodeId"]
        if backend is None or role in _SKIP_ROLES or backend not in boxes:
            continue
        box, z = boxes[backend]
        if box.area <= 0 or box.x >= vw or box.y >= vh or box.x + box.width <= 0 or box.y + box.height <= 0:
            continue
        name = str(_value(node.get("name")) or (label[1].strip() if label is not None else ""))
        url = str(props.get("url") or "") if role == "link" else ""
        element = Element(id=int(backend), role=str(role), name=name, bbox=box,
                          value=str(_value(node.get("value")) or ""),
                          focusable=bool(props.get("focusable")), z=int(z), url=url, states=_states(props))
        if element.interactive or name.strip() or label is not None:
            candidates[node["nodeId"]] = element

    elements = []
    for ax_id in _document_order(ax_nodes):
        element = candidates.get(ax_id)
        if element is None:
            continue
        owner, container = labels.get(element.id, (None,))[0], None
        parent = by_ax_id.get(ax_id, {}).get("parentId")
        while parent is not None and (owner is None or container is None):
            if parent in candidates:
                container = container or candidates[parent]
                if owner is None and candidates[parent].interactive:
                    owner = candidates[parent].id
            parent_backend = by_ax_id.get(parent, {}).get("backendDOMNodeId")
            if owner is None and labels.get(parent_backend, (element.id,))[0] != element.id:
                owner = labels[parent_backend][0]  # text inside a label acts on its control
            parent = by_ax_id.get(parent, {}).get("parentId")
        if (element.role == "StaticText" and container is not None
                and normalize_text(container.name) == normalize_text(element.name)):
            continue
        if owner is not None:
            element = dataclasses.replace(element, owner=owner)
        elements.append(element)
    focused = candidates.get(focused_ax) if focused_ax is not None else None
    return tuple(elements), (focused.id if focused is not None else None)


def _native_labels(ax_nodes: Sequence[Mapping[str, Any]]) -> dict[int, tuple[int, str]]:
    """Returns label backend node id -> (backend id of the control it labels, label text) for
    every native <label> (`for=` or wrapping) named in a control's name sources.

    aria-labelledby is left out on purpose: clicking such a "label" does not activate the control.
    A source superseded by aria-label still counts (the browser still forwards the click).
    """
    labels: dict[int, tuple[int, str]] = {}
    for node in ax_nodes:
        control = node.get("backendDOMNodeId")
        if node.get("ignored") or control is None:
            continue
        for source in (node.get("name") or {}).get("sources") or ():
            if source.get("nativeSource") not in ("labelfor", "labelwrapped"):
                continue
            for related in (source.get("nativeSourceValue") or {}).get("relatedNodes") or ():
                if related.get("backendDOMNodeId") is not None:
                    labels.setdefault(int(related["backendDOMNodeId"]), (int(control), str(related.get("text") or "")))
    return labels


def _document_order(ax_nodes: Sequence[Mapping[str, Any]]) -> list[str]:
    # getFullAXTree lists nodes breadth-first-ish; a depth-first walk gives reading order.
    if not ax_nodes:
        return []
    children = {n["nodeId"]: n.get("childIds") or () for n in ax_nodes}
    order, seen, stack = [], set(), [ax_nodes[0]["nodeId"]]
    while stack:
        node = stack.pop()
        if node in seen or node not in children:
            continue
        seen.add(node)
        order.append(node)
        stack.extend(reversed(children[node]))
    order.extend(n["nodeId"] for n in ax_nodes if n["nodeId"] not in seen)
    return order


def _states(props: Mapping[str, Any]) -> tuple[str, ...]:
    """Returns the user-visible states of an AX node's properties (Element.states' words and order)."""
    states = []
    if props.get("checked") in ("true", True, "mixed"):
        states.append("checked" if props["checked"] != "mixed" else "mixed")
    if props.get("selected") is True:
        states.append("selected")
    if "expanded" in props:
        states.append("expanded" if props["expanded"] else "collapsed")
    if props.get("disabled") is True:
        states.append("disabled")
    return tuple(states)


def _value(field: Any) -> Any:
    return field.get("value") if isinstance(field, Mapping) else None
