"""Semantic targets of actions and `same_action`: do two actions mean the same thing?

Both are pure functions of an action and an element list, so they work live (against the
observation the action was chosen on) and offline (against a stored observation).
"""
from __future__ import annotations

import math
from typing import Sequence

from rmsweb_jax.web.actions import POINTER_ACTIONS, RELATIVE, Action, CoordinateSpace, SemanticTarget
from rmsweb_jax.web.elements import SPATIAL_ROLES, Element, element_at, element_by_id, same_element
from rmsweb_jax.web.normalize import normalize_answer, normalize_keys, normalize_text, normalize_url

# Two clicks on no element (or on a canvas) are the same when this close, in CSS pixels.
POINT_TOLERANCE_PX = 8.0


def resolve_target(action: Action, elements: Sequence[Element], *, viewport: tuple[int, int],
                   focused_id: int | None = None, space: CoordinateSpace = RELATIVE) -> SemanticTarget:
    """Returns what `action` means on a page showing `elements`: the element under its point
    (or the focused element for typing without a point), the CSS point, and normalized text,
    URL or keys."""
    point = None if action.coordinate is None else space.to_css(action.coordinate, viewport)
    element = None
    if point is not None:
        element = element_at(elements, *point)
    elif action.name == "type":
        element = element_by_id(elements, focused_id)
    meaning = _text_only_target(action)
    return SemanticTarget(element=element, point=point, text=meaning.text, url=meaning.url, keys=meaning.keys)


def resolve_on(action: Action, observation, space: CoordinateSpace | None = None) -> Action:
    """Returns `action` with its target resolved against a (stored) Observation; the
    observation's own coordinate space is used unless `space` is given."""
    space = space or observation.coordinate_space
    return action.with_target(resolve_target(action, observation.elements, viewport=observation.viewport,
                                             focused_id=observation.focused_id, space=space))


def same_action(a: Action, b: Action, observation=None) -> bool:
    """Returns whether two actions mean the same thing.

    Same action name, and: clicks / hovers on the same element (and, on canvases or with no
    element, points within POINT_TOLERANCE_PX); typing the same normalized text into the same
    field with the same Enter; the same key chord; the same scroll direction; the same URL after
    normalization; answers equal after normalization. Actions without a target are resolved
    against `observation` when given (pointer actions need a target or an observation).
    """
    if a.name != b.name:
        return False
    if observation is not None:
        a = a if a.target is not None else resolve_on(a, observation)
        b = b if b.target is not None else resolve_on(b, observation)
    ta = a.target or _text_only_target(a)
    tb = b.target or _text_only_target(b)
    name = a.name
    if name in POINTER_ACTIONS:
        if a.target is None or b.target is None:
            raise ValueError(f"same_action on {name} needs resolved targets or an observation")
        return _same_place(ta, tb)
    if name == "type":
        if ta.text != tb.text or a.press_enter != b.press_enter:
            return False
        if ta.element is not None and tb.element is not None:
            return same_element(ta.element, tb.element)
        # Typing with no known field: compare the points when both clicked first.
        return ta.point is None or tb.point is None or _same_place(ta, tb)
    if name == "key":
        return ta.keys == tb.keys
    if name == "scroll":
        return a.direction == b.direction
    if name == "navigate":
        return ta.url == tb.url
    if name == "answer":
        return ta.text == tb.text
    return True  # go_back, wait: no arguments that change the meaning


def _text_only_target(action: Action) -> SemanticTarget:
    # The parts of a target that need no page: normalized text, URL and keys.
    text = None
    if action.name == "type" and action.text is not None:
        text = normalize_text(action.text)
    elif action.name == "answer" and action.text is not None:
        text = normalize_answer(action.text)
    return SemanticTarget(text=text, url=normalize_url(action.url) if action.url is not None else None,
                          keys=normalize_keys(action.keys) if action.keys else None)


def _same_place(a: SemanticTarget, b: SemanticTarget) -> bool:
    if a.element is not None and b.element is not None:
        if not same_element(a.element, b.element):
            return False
        if a.element.role not in SPATIAL_ROLES:
            return True
    elif a.element is not None or b.element is not None:
        return False
    if a.point is None or b.point is None:
        return a.point is None and b.point is None
    return math.dist(a.point, b.point) <= POINT_TOLERANCE_PX
