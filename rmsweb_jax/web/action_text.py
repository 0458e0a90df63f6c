"""The text form of an action as the model writes it: a thought, then one Qwen-style tool call.

    I need to press the OK button.
    <tool_call>
    {"name": "computer_use", "arguments": {"action": "left_click", "coordinate": [412, 530]}}
    </tool_call>

`parse_action` never raises: it returns a ParsedAction or a ParseError with its reason.
`parse_turn` reads a sampled turn with its finish reason: a turn the token limit cut is no action,
even when the cut text parses (mining's replay and the Salvage-DS rewards both judge samples by it).
`format_action` is its inverse for every valid action.
"""
from __future__ import annotations

import dataclasses
import json
from typing import Any

from rmsweb_jax.web.actions import RELATIVE, Action, ActionError, CoordinateSpace

TOOL_NAME = "computer_use"
OPEN, CLOSE = "<tool_call>", "</tool_call>"
PARSE_ERROR_REASONS = ("no_tool_call", "multiple_tool_calls", "invalid_json", "unknown_tool", "unknown_action",
                       "missing_argument", "invalid_argument", "coordinate_out_of_range", "internal_error",
                       "truncated")
FINISH_REASONS = ("stop", "length")  # a sampled turn ended by a stop token, or cut by the token limit


@dataclasses.dataclass(frozen=True)
class ParsedAction:
    """A successfully parsed model turn: the thought before the tool call, and the action."""

    thought: str
    action: Action
    ok = True


@dataclasses.dataclass(frozen=True)
class ParseError:
    """Why a model turn is not a valid action: `reason` (one of PARSE_ERROR_REASONS) and a message
    naming the offending part."""

    reason: str
    message: str
    ok = False


def parse_action(text: Any, space: CoordinateSpace = RELATIVE) -> ParsedAction | ParseError:
    """Returns the action in a model turn, or a ParseError; never raises, whatever `text` is."""
    try:
        return _parse(text, space)
    except Exception as e:  # noqa: BLE001 — the contract is "never raises"; report instead
        return ParseError("internal_error", f"{type(e).__name__}: {e}")


def parse_turn(text: Any, finish_reason: str, space: CoordinateSpace = RELATIVE) -> ParsedAction | ParseError:
    """Returns the action of a sampled turn, or a ParseError: reason "truncated" when the token limit cut it
    (`finish_reason` "length": the turn never ended, so it is not the policy's action even when the cut text
    parses, e.g. before its closing tag). Raises ValueError for a finish reason not in FINISH_REASONS."""
    if finish_reason not in FINISH_REASONS:
        raise ValueError(f"finish_reason {finish_reason!r}; expected one of {list(FINISH_REASONS)}")
    if finish_reason == "length":
        return ParseError("truncated", f"cut by the token limit: {_preview(text if isinstance(text, str) else '')}")
    return parse_action(text, space)


def _parse(text: Any, space: CoordinateSpace) -> ParsedAction | ParseError:
    if not isinstance(text, str):
        return ParseError("no_tool_call", f"expected a string, got {type(text).__name__}")
    count = text.count(OPEN)
    if count == 0:
        return ParseError("no_tool_call", f"no {OPEN} found in {_preview(text)}")
    if count > 1:
        return ParseError("multiple_tool_calls", f"{count} tool calls found; expected exactly one")
    start = text.index(OPEN)
    thought = text[:start].strip()
    body = text[start + len(OPEN):]
    # The closing tag is often cut off by a stop sequence; accept its absence.
    end = body.find(CLOSE)
    if end >= 0:
        body = body[:end]
    try:
        payload = json.loads(body)
    except (ValueError, RecursionError) as e:
        return ParseError("invalid_json", f"tool call body is not JSON ({e}): {_preview(body)}")
    if not isinstance(payload, dict):
        return ParseError("invalid_json", f"tool call must be a JSON object, got {type(payload).__name__}")
    name = payload.get("name")
    if name != TOOL_NAME:
        return ParseError("unknown_tool", f"tool name {name!r}; expected {TOOL_NAME!r}")
    args = payload.get("arguments")
    if isinstance(args, str):  # some models double-encode the arguments
        try:
            args = json.loads(args)
        except (ValueError, RecursionError) as e:
            return ParseError("invalid_json", f"arguments string is not JSON ({e})")
    if not isinstance(args, dict):
        return ParseError("missing_argument" if args is None else "invalid_json",
                          f"tool call needs an 'arguments' object, got {type(args).__name__}")
    extra = set(payload) - {"name", "arguments"}
    if extra:
        return ParseError("invalid_json", f"unexpected tool call keys {sorted(extra)}")
    try:
        action = Action.from_arguments(args, space)
    except ActionError as e:
        return ParseError(e.reason, str(e))
    return ParsedAction(thought=thought, action=action)


def format_action(action: Action, thought: str = "") -> str:
    """Returns the model-turn text for `action` after `thought`; parse_action reads it back.

    Raises ValueError when `thought` contains a tool-call tag (it would read as a second call).
    """
    if OPEN in thought:
        raise ValueError(f"thought must not contain {OPEN!r}: {_preview(thought)}")
    payload = json.dumps({"name": TOOL_NAME, "arguments": action.to_arguments()}, ensure_ascii=False)
    # Inside JSON strings a tag would end or duplicate the call; \u003c reads back as "<".
    payload = payload.replace(OPEN, "\\u003ctool_call>").replace(CLOSE, "\\u003c/tool_call>")
    call = f"{OPEN}\n{payload}\n{CLOSE}"
    thought = thought.strip()
    return f"{thought}\n{call}" if thought else call


def _preview(text: str, limit: int = 80) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "...")
