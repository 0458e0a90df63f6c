"""Semantic targets of actions, and `compare_actions`: does a sampled action mean what the
reference action means, and if not, how does it differ?

Both are pure functions of actions and an element list, so they work live (against the
observation the action was chosen on) and offline (against a stored observation). The rules:

- Actions without a target are resolved against the observation (the element under the point,
  or the focused field for typing without a point); pointer actions need one or the other.
- A different action name is `wrong_action_type`, except an answer where the reference goes on:
  `premature_answer` (answer is the only action that ends an episode, so it is also the
  "premature stop"). left_click, double_click and hover are different types.
- Clicks / hovers: the same element wherever the point fell inside it (a click on text inside a
  button is a click on the button: `elements.element_at`), including a native <label>, which
  resolves to the control it labels, as the browser forwards the click. On spatial elements
  (canvas, image; SPATIAL_ROLES) and where no element is under either point, the points must be
  within POINT_TOLERANCE_PX. An element against none is `no_element`; two different elements are
  `wrong_element_same_role` or `wrong_element_other_role`.
- Two elements are the same element when `same_element` says so (role, name, box), or when they
  are links with the same normalized name to the same URL (a "Home" link in the header and the
  footer: the page accepts either, as both go to the same place). Only links qualify: buttons and
  other controls that share a name (the "Add to cart" of every row) differ by context the
  element list does not carry, and calling two of them the same would reward the wrong row. A
  link whose URL has a fragment, is `javascript:` or is the page itself does not qualify either
  (`href="#"` links run scripts that differ per link).
- Typing: the field first (as for clicks; typing with no point while nothing is focused goes to
  no field, so it is `no_element` against typing into a field), then the normalized text
  (`wrong_text`), Enter (`wrong_enter`), then `clear` (`wrong_clear`): leaving the old text when
  the reference clears it always counts, as the stored value of a field can be stale or empty
  when the reference's author saw text; clearing when the reference does not counts only when the
  field holds text (clearing an empty field changes nothing). Without an observation, two typing
  actions without targets compare by text, Enter and clear only.
- key: the same normalized chord (`wrong_key`); scroll: the same direction (`wrong_scroll`, the
  amount and point are ignored); navigate: the same normalized URL (`wrong_url`); answer: equal
  after normalization (`wrong_answer`); go_back and wait: always the same.
- A turn that did not parse (action_text.ParseError) is `unparseable`.

The first difference in the order above is the one reported. `same_action(a, b, obs)` is
`compare_actions(a, b, obs).same`.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Sequence

from rmsweb_jax.web.action_text import ParseError, ParsedAction
from rmsweb_jax.web.actions import POINTER_ACTIONS, RELATIVE, Action, CoordinateSpace, SemanticTarget
from rmsweb_jax.web.elements import SPATIAL_ROLES, Element, element_at, element_by_id, same_element
from rmsweb_jax.web.normalize import normalize_answer, normalize_keys, normalize_text, normalize_url

# Two clicks on no element (or on a canvas) are the same when this close, in CSS pixels.
POINT_TOLERANCE_PX = 8.0
# What compare_actions can say about a sampled action, "same" first.
CATEGORIES = ("same", "unparseable", "wrong_action_type", "premature_answer", "wrong_element_same_role",
              "wrong_element_other_role", "no_element", "wrong_point", "wrong_text", "wrong_enter", "wrong_clear",
              "wrong_key", "wrong_scroll", "wrong_url", "wrong_answer")


@dataclasses.dataclass(frozen=True)
class Comparison:
    """How a sampled action compares with the reference: `same`, the `category` of the first
    difference (one of CATEGORIES, "same" when same) and a short human-readable `detail`."""

    same: bool
    category: str
    detail: str

    def __post_init__(self):
        if self.category not in CATEGORIES:
            raise ValueError(f"Comparison.category must be one of {CATEGORIES}, got {self.category!r}")
        if self.same != (self.category == "same"):
            raise ValueError(f"Comparison.same={self.same} contradicts category {self.category!r}")


SAME = Comparison(True, "same", "same action")


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


def compare_actions(sampled: Action | ParsedAction | ParseError, reference: Action,
                    observation=None) -> Comparison:
    """Returns how `sampled` (an action, or what `action_text.parse_action` returned) compares
    with `reference`, by the rules of the module docstring. Raises ValueError when pointer
    actions have neither targets nor an observation to resolve them on."""
    if isinstance(sampled, ParseError):
        return Comparison(False, "unparseable", f"unparseable turn ({sampled.reason})")
    if isinstance(sampled, ParsedAction):
        sampled = sampled.action
    if not isinstance(sampled, Action) or not isinstance(reference, Action):
        raise TypeError(f"compare_actions takes Actions (sampled may be a parse result), got "
                        f"{type(sampled).__name__} and {type(reference).__name__}")
    name = reference.name
    if sampled.name != name:
        category = "premature_answer" if sampled.name == "answer" else "wrong_action_type"
        return Comparison(False, category, f"{sampled.name} instead of {name}")
    if observation is not None:
        sampled = sampled if sampled.target is not None else resolve_on(sampled, observation)
        reference = reference if reference.target is not None else resolve_on(reference, observation)
    ts, tr = sampled.target or _text_only_target(sampled), reference.target or _text_only_target(reference)
    page_url = None if observation is None else observation.url
    if name in POINTER_ACTIONS:
        if sampled.target is None or reference.target is None:
            raise ValueError(f"compare_actions on {name} needs resolved targets or an observation")
        return _place_difference(ts, tr, page_url) or SAME
    if name == "type":
        return _typing_difference(sampled, reference, ts, tr, page_url) or SAME
    if name == "key" and ts.keys != tr.keys:
        return Comparison(False, "wrong_key", f"keys {ts.keys} instead of {tr.keys}")
    if name == "scroll" and sampled.direction != reference.direction:
        return Comparison(False, "wrong_scroll", f"scroll {sampled.direction} instead of {reference.direction}")
    if name == "navigate" and ts.url != tr.url:
        return Comparison(False, "wrong_url", f"{_short(ts.url)} instead of {_short(tr.url)}")
    if name == "answer" and ts.text != tr.text:
        return Comparison(False, "wrong_answer", f"answered {_short(ts.text)} instead of {_short(tr.text)}")
    return SAME  # go_back, wait: no arguments that change the meaning


def same_action(a: Action, b: Action, observation=None) -> bool:
    """Returns whether `a` means what `b` means: `compare_actions(a, b, observation).same`."""
    return compare_actions(a, b, observation).same


def _text_only_target(action: Action) -> SemanticTarget:
    # The parts of a target that need no page: normalized text, URL and keys.
    text = None
    if action.name == "type" and action.text is not None:
        text = normalize_text(action.text)
    elif action.name == "answer" and action.text is not None:
        text = normalize_answer(action.text)
    return SemanticTarget(text=text, url=normalize_url(action.url) if action.url is not None else None,
                          keys=normalize_keys(action.keys) if action.keys else None)


def _typing_difference(sampled: Action, reference: Action, ts: SemanticTarget, tr: SemanticTarget,
                       page_url: str | None) -> Comparison | None:
    place = _place_difference(ts, tr, page_url)
    if place is not None:
        return place
    if ts.text != tr.text:
        return Comparison(False, "wrong_text", f"typed {_short(ts.text)} instead of {_short(tr.text)}")
    if sampled.press_enter != reference.press_enter:
        return Comparison(False, "wrong_enter", f"press_enter={sampled.press_enter}, reference {reference.press_enter}")
    field = tr.element or ts.element
    if reference.clear and not sampled.clear:
        return Comparison(False, "wrong_clear", "kept the field's text; the reference clears it")
    if sampled.clear and not reference.clear and field is not None and field.value.strip():
        return Comparison(False, "wrong_clear", f"cleared {_short(field.value)}, which the reference keeps")
    return None


def _place_difference(s: SemanticTarget, r: SemanticTarget, page_url: str | None) -> Comparison | None:
    # Where an action acts: the element, and the point where the element does not settle it.
    if s.element is not None and r.element is not None:
        if not _same_target_element(s.element, r.element, page_url):
            category = "wrong_element_same_role" if s.element.role == r.element.role else "wrong_element_other_role"
            return Comparison(False, category, f"{_describe(s.element)} instead of {_describe(r.element)}")
        if s.element.role not in SPATIAL_ROLES:
            return None
    elif s.element is not None or r.element is not None:
        return Comparison(False, "no_element", f"{_describe(s.element)} instead of {_describe(r.element)}")
    if s.point is None and r.point is None:
        return None
    if s.point is None or r.point is None:
        return Comparison(False, "wrong_point", "one action has a point and the other none")
    distance = math.dist(s.point, r.point)
    if distance <= POINT_TOLERANCE_PX:
        return None
    return Comparison(False, "wrong_point",
                      f"{distance:.0f} px from the reference point (tolerance {POINT_TOLERANCE_PX:g})")


def _same_target_element(a: Element, b: Element, page_url: str | None) -> bool:
    if same_element(a, b):
        return True
    return (a.role == b.role == "link" and normalize_text(a.name) == normalize_text(b.name)
            and _stable_link(a.url, page_url) and normalize_url(a.url) == normalize_url(b.url))


def _stable_link(url: str, page_url: str | None) -> bool:
    # A link whose effect is its destination: not a script, a fragment or the page itself.
    if not url or "#" in url or url.lower().startswith("javascript:"):
        return False
    return page_url is None or normalize_url(url) != normalize_url(page_url)


def _describe(element: Element | None) -> str:
    return "no element" if element is None else f"{element.role} {_short(element.name)}"


def _short(text: str | None, limit: int = 40) -> str:
    if text is None:
        return "nothing"
    return repr(text if len(text) <= limit else text[:limit] + "...")
