"""Actions in Qwen3-VL's computer-use convention, their validation, and their semantic target.

An Action is what the model asked for; its `target` (filled when the action is resolved against
an observation) is what it meant: the element under the point, the focused field for typing,
the normalized text, URL or keys.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping

from rmsweb_jax.web.elements import Element
from rmsweb_jax.web.normalize import playwright_key

ACTION_NAMES = ("left_click", "double_click", "hover", "type", "key", "scroll", "go_back", "navigate", "wait", "answer")
POINTER_ACTIONS = frozenset({"left_click", "double_click", "hover"})
SCROLL_DIRECTIONS = ("up", "down", "left", "right")
MAX_WAIT_S = 60.0

# Arguments each action requires / may carry (besides "action"), by tool-call key.
_REQUIRED: dict[str, tuple[str, ...]] = {
    "left_click": ("coordinate",), "double_click": ("coordinate",), "hover": ("coordinate",),
    "type": ("text",), "key": ("keys",), "scroll": ("direction", "amount"), "go_back": (),
    "navigate": ("url",), "wait": (), "answer": ("text",),
}
_OPTIONAL: dict[str, tuple[str, ...]] = {
    "type": ("coordinate", "press_enter", "clear"), "scroll": ("coordinate",), "wait": ("time",),
}


class ActionError(ValueError):
    """An action that breaks the schema; `reason` is one of the parse-error reasons."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


@dataclasses.dataclass(frozen=True)
class CoordinateSpace:
    """How the model's coordinates map to the page: Qwen's 0-1000 relative grid, or pixels of a
    `width` x `height` screenshot."""

    kind: str = "relative"
    width: int = 1000
    height: int = 1000

    def __post_init__(self):
        if self.kind not in ("relative", "pixel"):
            raise ValueError(f"CoordinateSpace.kind must be 'relative' or 'pixel', got {self.kind!r}")
        if self.kind == "relative" and (self.width, self.height) != (1000, 1000):
            raise ValueError(f"a relative CoordinateSpace is 1000 x 1000, got {self.width} x {self.height}")
        if self.width <= 0 or self.height <= 0:
            raise ValueError(f"CoordinateSpace size must be positive, got {self.width} x {self.height}")

    @classmethod
    def pixels(cls, width: int, height: int) -> "CoordinateSpace":
        """Returns the pixel space of a width x height screenshot."""
        return cls("pixel", width, height)

    def to_css(self, point: tuple[float, float], viewport: tuple[int, int]) -> tuple[float, float]:
        """Returns the viewport CSS-pixel point for a model `point`, clamped inside the viewport."""
        vw, vh = viewport
        x = point[0] / self.width * vw
        y = point[1] / self.height * vh
        return (min(max(x, 0.0), vw - 1.0), min(max(y, 0.0), vh - 1.0))

    def from_css(self, point: tuple[float, float], viewport: tuple[int, int]) -> tuple[int, int]:
        """Returns the model coordinate (rounded) for a viewport CSS-pixel point."""
        vw, vh = viewport
        return (round(point[0] / vw * self.width), round(point[1] / vh * self.height))


RELATIVE = CoordinateSpace()


@dataclasses.dataclass(frozen=True)
class SemanticTarget:
    """What an executed action meant: the element acted on (element under the point, or the
    focused field for typing), the CSS-pixel point, and the normalized text / URL / keys."""

    element: Element | None = None
    point: tuple[float, float] | None = None
    text: str | None = None
    url: str | None = None
    keys: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """Returns a JSON-ready dict."""
        return {"element": None if self.element is None else self.element.to_dict(),
                "point": None if self.point is None else [round(v, 2) for v in self.point],
                "text": self.text, "url": self.url, "keys": self.keys}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "SemanticTarget":
        """Returns the target stored by `to_dict`."""
        return cls(element=None if d.get("element") is None else Element.from_dict(d["element"]),
                   point=None if d.get("point") is None else (float(d["point"][0]), float(d["point"][1])),
                   text=d.get("text"), url=d.get("url"), keys=d.get("keys"))


@dataclasses.dataclass(frozen=True)
class Action:
    """One computer-use action. Fields not used by `name` stay None / False / ().

    `coordinate` is in the model's coordinate space (0-1000 relative unless configured);
    `seconds` is the tool call's "time" argument of `wait`.
    """

    name: str
    coordinate: tuple[int, int] | None = None
    text: str | None = None
    press_enter: bool = False
    clear: bool = False
    keys: tuple[str, ...] = ()
    direction: str | None = None
    amount: int | None = None
    url: str | None = None
    seconds: float | None = None
    target: SemanticTarget | None = None

    def __post_init__(self):
        # Validating through the argument form keeps one set of rules for both entry points,
        # and stores the same normalized values (tuples, lower-case direction, int amount).
        checked = Action.from_arguments(self.to_arguments(), space=None)
        for f in dataclasses.fields(self):
            if f.name != "target":
                object.__setattr__(self, f.name, getattr(checked, f.name))

    # --- convenience constructors -------------------------------------------------------
    @classmethod
    def click(cls, x: int, y: int) -> "Action":
        """Returns a left_click at model coordinate (x, y)."""
        return cls("left_click", coordinate=(x, y))

    @classmethod
    def type_text(cls, text: str, *, press_enter: bool = False, clear: bool = False,
                  coordinate: tuple[int, int] | None = None) -> "Action":
        """Returns a type action."""
        return cls("type", text=text, press_enter=press_enter, clear=clear, coordinate=coordinate)

    @classmethod
    def answer_with(cls, text: str) -> "Action":
        """Returns an answer action (it ends the episode)."""
        return cls("answer", text=text)

    def with_target(self, target: SemanticTarget | None) -> "Action":
        """Returns a copy carrying `target`."""
        return dataclasses.replace(self, target=target)

    # --- tool-call arguments ------------------------------------------------------------
    def to_arguments(self) -> dict[str, Any]:
        """Returns the tool call's "arguments" object (`{"action": ..., ...}`), optional
        arguments only when set."""
        args: dict[str, Any] = {"action": self.name}
        if self.keys:
            args["keys"] = self.keys if isinstance(self.keys, str) else list(self.keys)
        if self.text is not None:
            args["text"] = self.text
        if self.coordinate is not None:
            args["coordinate"] = list(self.coordinate)
        if self.direction is not None:
            args["direction"] = self.direction
        if self.amount is not None:
            args["amount"] = self.amount
        if self.url is not None:
            args["url"] = self.url
        if self.seconds is not None:
            args["time"] = self.seconds
        if self.press_enter:
            args["press_enter"] = True
        if self.clear:
            args["clear"] = True
        return args

    @classmethod
    def from_arguments(cls, args: Mapping[str, Any], space: CoordinateSpace | None = RELATIVE) -> "Action":
        """Returns the Action for a tool call's arguments object.

        Raises ActionError with reason unknown_action, missing_argument, invalid_argument or
        coordinate_out_of_range, naming the argument and value at fault. `space=None` skips the
        range check (pixel spaces whose size is not known yet).
        """
        if not isinstance(args, Mapping):
            raise ActionError("invalid_argument", f"arguments must be a JSON object, got {type(args).__name__}")
        name = args.get("action")
        if not isinstance(name, str) or name not in _REQUIRED:
            raise ActionError("unknown_action", f"action {name!r} is not one of {list(ACTION_NAMES)}")
        allowed = set(_REQUIRED[name]) | set(_OPTIONAL.get(name, ())) | {"action"}
        for key in args:
            if key not in allowed:
                raise ActionError("invalid_argument", f"{name} takes no argument {key!r}; allowed: {sorted(allowed - {'action'})}")
        for key in _REQUIRED[name]:
            if key not in args or args[key] is None:
                raise ActionError("missing_argument", f"{name} needs argument {key!r}")
        fields: dict[str, Any] = {"name": name}
        if "coordinate" in args and args["coordinate"] is not None:
            fields["coordinate"] = _coordinate(args["coordinate"], space)
        if "text" in args:
            fields["text"] = _string(args["text"], "text", allow_empty=True)
        if "keys" in args:
            fields["keys"] = _keys(args["keys"])
        if "direction" in args:
            direction = args["direction"]
            if not isinstance(direction, str) or direction.lower() not in SCROLL_DIRECTIONS:
                raise ActionError("invalid_argument", f"direction must be one of {list(SCROLL_DIRECTIONS)}, got {direction!r}")
            fields["direction"] = direction.lower()
        if "amount" in args:
            amount = _number(args["amount"], "amount")
            if not 1 <= round(amount) <= 100_000:
                raise ActionError("invalid_argument", f"amount must be 1..100000 pixels, got {amount!r}")
            fields["amount"] = int(round(amount))
        if "url" in args:
            fields["url"] = _string(args["url"], "url", allow_empty=False)
        if "time" in args and args["time"] is not None:
            seconds = _number(args["time"], "time")
            if not 0 <= seconds <= MAX_WAIT_S:
                raise ActionError("invalid_argument", f"time must be 0..{MAX_WAIT_S:g} seconds, got {seconds!r}")
            fields["seconds"] = float(seconds)
        for flag in ("press_enter", "clear"):
            if flag in args and args[flag] is not None:
                if not isinstance(args[flag], bool):
                    raise ActionError("invalid_argument", f"{flag} must be true or false, got {args[flag]!r}")
                fields[flag] = args[flag]
        action = object.__new__(cls)
        for f in dataclasses.fields(cls):
            object.__setattr__(action, f.name, fields.get(f.name, f.default))
        return action

    # --- storage ------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """Returns a JSON-ready dict: the tool-call arguments plus the semantic target."""
        return {"arguments": self.to_arguments(), "target": None if self.target is None else self.target.to_dict()}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Action":
        """Returns the action stored by `to_dict`."""
        action = cls.from_arguments(d["arguments"], space=None)
        target = d.get("target")
        return action if target is None else action.with_target(SemanticTarget.from_dict(target))


def _number(value: Any, key: str) -> int | float:
    # JSON integers are unbounded: math.isfinite(10**400) raises OverflowError, so only floats
    # go through it; callers compare ints exactly (an int beyond float range is simply too large).
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (
            isinstance(value, float) and not math.isfinite(value)):
        raise ActionError("invalid_argument", f"{key} must be a finite number, got {value!r}")
    return value


def _string(value: Any, key: str, *, allow_empty: bool) -> str:
    if not isinstance(value, str) or (not allow_empty and not value.strip()):
        raise ActionError("invalid_argument", f"{key} must be a {'' if allow_empty else 'non-empty '}string, got {value!r}")
    return value


def _coordinate(value: Any, space: CoordinateSpace | None) -> tuple[int, int]:
    if not isinstance(value, (list, tuple)) or len(value) != 2:
        raise ActionError("invalid_argument", f"coordinate must be [x, y], got {value!r}")
    x, y = (_number(v, "coordinate") for v in value)
    if abs(x) > 1e9 or abs(y) > 1e9:
        raise ActionError("coordinate_out_of_range", f"coordinate {value!r} is far outside any screen")
    x, y = int(round(x)), int(round(y))
    if space is not None and not (0 <= x <= space.width and 0 <= y <= space.height):
        raise ActionError("coordinate_out_of_range",
                          f"coordinate {[x, y]} is outside the {space.kind} space 0..{space.width} x 0..{space.height}")
    if space is None and (x < 0 or y < 0):
        raise ActionError("coordinate_out_of_range", f"coordinate {[x, y]} is negative")
    return (x, y)


def _keys(value: Any) -> tuple[str, ...]:
    if isinstance(value, str):  # models often write "keys": "ctrl+a"
        value = [k for k in value.split("+")] if value != "+" else ["+"]
    if not isinstance(value, (list, tuple)) or not value or len(value) > 8:
        raise ActionError("invalid_argument", f"keys must be a list of 1..8 key names, got {value!r}")
    for key in value:
        if not isinstance(key, str) or playwright_key(key) is None:
            raise ActionError("invalid_argument", f"unknown key {key!r} in keys {value!r}")
    return tuple(value)
