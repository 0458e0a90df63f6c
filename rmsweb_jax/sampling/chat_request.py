"""The chat-completions request a ChatServer accepts: parsed, checked, and normalized.

Each check names the field at fault (`messages[2].content[1].image_url.url`) in an
OpenAI-style error. Nothing is silently ignored: a field this server does not implement is a 400
naming it (`unsupported_parameter`), unless it holds null or its no-op value (`frequency_penalty: 0`,
`response_format: {"type": "text"}`), which the server honours by doing nothing. Unknown fields are
refused the same way, so a misspelt `max_token` is an error, not a reply of the default length.

Tool requests (`tools`, `role: "tool"` messages, assistant messages with `tool_calls`) are checked
here and rendered into the plain turns the chat template reads by `tool_calls.plain_messages`.

Everything here runs on the request's own thread before it queues, and bounds what it lets
through: numbers to their types' ranges (JSON integers are unbounded), images by the pixel count
in their header (read before a pixel is decoded), and text by its UTF-8 size (before tokenizing).
"""
from __future__ import annotations

import base64
import dataclasses
import io
import json
import math
import warnings
from typing import Any

from PIL import Image

from rmsweb_jax.processing.chat import decode_image_part
from rmsweb_jax.sampling.params import SamplingParams
from rmsweb_jax.sampling.tool_calls import plain_messages

ROLES = ("system", "developer", "user", "assistant", "tool")  # developer: OpenAI's newer name for system
# Fields read below. Everything else in a body must be null or absent, hold its no-op value (NO_OP_VALUES), or be
# one of IGNORED_FIELDS.
IMPLEMENTED_FIELDS = ("model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k",
                      "seed", "stop", "n", "stream", "stream_options", "logprobs", "top_logprobs", "tools",
                      "tool_choice", "parallel_tool_calls", "user")
# Fields that cannot change a reply, accepted whatever they hold and named in the reply's IGNORED_HEADER and the
# request's log line: OpenAI's bookkeeping of stored completions.
IGNORED_FIELDS = {"metadata": dict, "store": bool}
IGNORED_HEADER = "X-Rmsweb-Ignored-Fields"
# field -> (the values that change nothing, what to tell a client that sent another)
NO_OP_VALUES = {
    "frequency_penalty": ((0,), "penalties are not applied by this server; expected 0 or null"),
    "presence_penalty": ((0,), "penalties are not applied by this server; expected 0 or null"),
    "response_format": (({"type": "text"},), "constrained (JSON) output is not implemented; expected "
                        "{\"type\": \"text\"} or null"),
    "logit_bias": (({},), "logit biases are not applied by this server; expected {} or null"),
    "repetition_penalty": ((1,), "penalties are not applied by this server; expected 1 or null"),
    "min_p": ((0,), "min-p filtering is not implemented; expected 0 or null"),
}
MESSAGE_FIELDS = {"system": ("role", "content", "name"), "developer": ("role", "content", "name"),
                  "user": ("role", "content", "name"),
                  "assistant": ("role", "content", "tool_calls", "refusal"),
                  "tool": ("role", "content", "tool_call_id")}
MAX_TOP_LOGPROBS = 20  # OpenAI's limit
TOOL_CHOICES = ("auto", "none")
MAX_STOP_STRINGS = 4
INT64 = (-(2 ** 63), 2 ** 63 - 1)  # OpenAI's seed is an int64
SEED_MODULUS = 2 ** 32  # jax.random.key keeps the low 32 bits of a seed (without x64)
MAX_TOP_K = 2 ** 31 - 1  # an int32 in the sampler; any top_k above the vocabulary means "off"
# The server's default limits (its flags and ChatServer's arguments read these).
DEFAULT_MAX_IMAGE_PIXELS = 1920 * 1080  # a full-HD screenshot
DEFAULT_MAX_PROMPT_BYTES = 1 << 20  # 32 bytes a token at the 32768-token bucket: no real prompt that fits is refused
DEFAULT_MAX_N = 16  # choices a request may ask for (n): each one is a row of the generation


class RequestError(Exception):
    """A request the server refuses: HTTP `status` and the OpenAI error fields."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None,
                 type_: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.type = status, message, param, code, type_

    def to_dict(self) -> dict[str, Any]:
        """Returns the OpenAI error body {"error": {"message", "type", "param", "code"}}."""
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


@dataclasses.dataclass(frozen=True)
class ChatRequest:
    """A checked request: messages (content normalized to a str or a list of text / image_url
    parts), the sampling settings, the seed (the request's, reduced mod 2**32; None: the server
    picks one), stop strings, each image's (width, height) in message order, the UTF-8 bytes
    of all its text, and n (the choices asked for)."""

    messages: list
    params: SamplingParams
    seed: int | None = None
    stop: tuple[str, ...] = ()
    image_sizes: tuple[tuple[int, int], ...] = ()
    text_bytes: int = 0
    n: int = 1
    stream: bool = False
    include_usage: bool = False  # stream_options.include_usage: a last chunk carries the usage
    logprobs: bool = False
    top_logprobs: int = 0
    parse_tool_calls: bool = False  # the request has tools and tool_choice "auto": replies are parsed for calls
    parallel_tool_calls: bool = True  # false: a reply returns its first parsed call only
    ignored: tuple[str, ...] = ()  # IGNORED_FIELDS the body held (said in a header and the log)
    tool_turns: bool = False  # tools, tool results or assistant tool calls were written into the messages
    user: str | None = None  # the client's end-user id, written in the request log


def _invalid(param: str, message: str, code: str = "invalid_value") -> RequestError:
    return RequestError(400, f"{param}: {message}", param=param, code=code)


def _preview(value: Any) -> str:
    """Returns a short repr of a JSON value (never the repr of a whole 10 MB or 900-deep value)."""
    if isinstance(value, (list, dict)):
        return f"a JSON {'array' if isinstance(value, list) else 'object'} of {len(value)} item(s)"
    text = repr(value[:60] if isinstance(value, str) else value)
    return text if len(text) <= 80 else text[:77] + "..."


def _number(body: dict, key: str, default: float, low: float, high: float, *, open_low: bool = False) -> float:
    value = body.get(key)
    if value is None:
        return default
    # Only floats go through isfinite: JSON integers are unbounded and math.isfinite(10**400) raises.
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (
            isinstance(value, float) and not math.isfinite(value)):
        raise _invalid(key, f"expected a number, got {_preview(value)}", "invalid_type")
    if value > high or value < low or (open_low and value == low):
        bracket = "(" if open_low else "["
        raise _invalid(key, f"expected a number in {bracket}{low:g}, {high:g}], got {_preview(value)}")
    return float(value)


def _integer(body: dict, key: str, low: int | None = None, high: int | None = None) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise _invalid(key, f"expected an integer, got {_preview(value)}", "invalid_type")
    if (low is not None and value < low) or (high is not None and value > high):
        raise _invalid(key, f"expected an integer in [{low}, {high}], got {_preview(value)}")
    return value


def _header_size(url: str) -> tuple[int, int] | None:
    """Returns (width, height) from an image data URL's header without decoding pixels, or None
    when the URL or image is malformed (decode_image_part then says exactly what is wrong).
    Raises Image.DecompressionBombError past Pillow's own limit (2 x Image.MAX_IMAGE_PIXELS)."""
    header, sep, payload = url.partition(",")
    if not (header.startswith("data:") and sep):
        return None
    try:
        data = base64.b64decode(payload, validate=True)
    except ValueError:  # binascii.Error is a ValueError
        return None
    with warnings.catch_warnings():  # between PIL's warning and error sizes: our own limit decides
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        try:
            with Image.open(io.BytesIO(data)) as image:  # lazy: reads the header only
                return image.size
        except Image.DecompressionBombError:
            raise
        except Exception:  # noqa: BLE001 — PIL raises many types; decode_image_part reports the error
            return None


def check_image_url(url: Any, param: str, max_pixels: int) -> tuple[int, int]:
    """Returns (width, height) of a data:image/...;base64 URL's image; raises RequestError unless
    it decodes and has at most `max_pixels` pixels (checked from the header, before decoding)."""
    if not isinstance(url, str):
        raise _invalid(param, f"expected a string, got {type(url).__name__}", "invalid_type")
    limit = f"this server's limit of {max_pixels:,} pixels (--max_image_pixels); send a smaller image"
    try:
        size = _header_size(url)
    except Image.DecompressionBombError as e:
        raise _invalid(param, f"image refused from its header ({e}); {limit}", "image_too_large") from None
    if size is not None and size[0] * size[1] > max_pixels:
        raise _invalid(param, f"image of {size[0]}x{size[1]} ({size[0] * size[1]:,} pixels) exceeds {limit}",
                       "image_too_large")
    try:  # the same rules the model's prompt encoder applies, checked before the request queues
        image = decode_image_part({"type": "image_url", "image_url": {"url": url}})
    except ValueError as e:
        raise _invalid(param, str(e), "invalid_image") from None
    image.close()
    return image.size


def _utf8_size(text: str, param: str, budget: int) -> int:
    """Returns len(text.encode()) (or any number > budget once it is past it); raises RequestError
    on text that is not UTF-8 (lone surrogates, which JSON allows as escapes)."""
    if len(text) > budget or text.isascii():  # a character is at least one byte
        return len(text)
    try:
        return len(text.encode("utf-8"))
    except UnicodeEncodeError as e:
        raise _invalid(param, f"text is not valid Unicode: {e.reason} at character {e.start}") from None


@dataclasses.dataclass
class _Tally:
    """What the messages hold so far: image sizes, and the text's UTF-8 bytes."""

    max_image_pixels: int
    max_prompt_bytes: int
    image_sizes: list = dataclasses.field(default_factory=list)
    text_bytes: int = 0

    def text(self, text: str, param: str) -> None:
        self.text_bytes += _utf8_size(text, param, self.max_prompt_bytes - self.text_bytes)
        if self.text_bytes > self.max_prompt_bytes:
            raise RequestError(400, f"messages: the text is longer than this server's limit of {self.max_prompt_bytes:,}"
                               " UTF-8 bytes (--max_prompt_bytes), so the prompt cannot fit; send a shorter one "
                               f"(the limit was passed at {param})", param="messages", code="prompt_too_long")


def _content(content: Any, param: str, role: str, tally: _Tally) -> str | list[dict[str, Any]]:
    """Returns the content normalized: a str, or a list of text / image_url parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        tally.text(content, param)
        return content
    if not isinstance(content, list):
        raise _invalid(param, f"expected a string or a list of parts, got {type(content).__name__}", "invalid_type")
    parts = []
    for j, part in enumerate(content):
        where = f"{param}[{j}]"
        if not isinstance(part, dict):
            raise _invalid(where, f"expected an object, got {type(part).__name__}", "invalid_type")
        kind = part.get("type")
        if kind == "text":
            if not isinstance(part.get("text"), str):
                raise _invalid(f"{where}.text", f"expected a string, got {_preview(part.get('text'))}", "invalid_type")
            tally.text(part["text"], f"{where}.text")
            parts.append({"type": "text", "text": part["text"]})
        elif kind == "image_url":
            if role != "user":  # chat templates drop images of other turns: refuse, not lose pixels
                raise _invalid(where, f"images are accepted only in user messages, not in a {role} message")
            image = part.get("image_url")
            url = image.get("url") if isinstance(image, dict) else image
            tally.image_sizes.append(check_image_url(url, f"{where}.image_url.url", tally.max_image_pixels))
            parts.append({"type": "image_url", "image_url": {"url": url}})
        else:
            raise _invalid(f"{where}.type", f"expected 'text' or 'image_url', got {_preview(kind)}")
    return parts


def _messages(value: Any, tally: _Tally) -> list[dict[str, Any]]:
    if value is None:
        raise RequestError(400, "messages: required field is missing", param="messages", code="missing_field")
    if not isinstance(value, list) or not value:
        raise _invalid("messages", f"expected a non-empty list of messages, got {_preview(value)}")
    messages = []
    for i, message in enumerate(value):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise _invalid(where, f"expected an object, got {type(message).__name__}", "invalid_type")
        role = message.get("role")
        if role not in ROLES:
            raise _invalid(f"{where}.role", f"expected one of {list(ROLES)}, got {_preview(role)}")
        for key, value in message.items():
            if key not in MESSAGE_FIELDS[role] and value is not None:
                raise _invalid(f"{where}.{key}", f"not supported in a {role} message by this server; expected "
                               f"only {list(MESSAGE_FIELDS[role])}", "unsupported_parameter")
        tool_calls = message.get("tool_calls") if role == "assistant" else None
        if "content" not in message and not tool_calls:
            raise RequestError(400, f"{where}.content: required field is missing", param=f"{where}.content",
                               code="missing_field")
        name = message.get("name")
        if name is not None and not isinstance(name, str):
            raise _invalid(f"{where}.name", f"expected a string, got {_preview(name)}", "invalid_type")
        # the chat template knows no developer role or participant names: a developer message is a system one
        checked = {"role": "system" if role == "developer" else role,
                   "content": _content(message.get("content"), f"{where}.content", role, tally)}
        if tool_calls:
            checked["tool_calls"] = _tool_calls(tool_calls, f"{where}.tool_calls", tally)
        if role == "tool" and not isinstance(message.get("tool_call_id"), str):
            raise _invalid(f"{where}.tool_call_id", f"expected the id of the call it answers (a string), got "
                           f"{_preview(message.get('tool_call_id'))}", "invalid_type")
        messages.append(checked)
    return messages


def _tool_calls(value: Any, param: str, tally: _Tally) -> list[dict[str, Any]]:
    """Returns an assistant message's tool calls as [{"name", "arguments" (a JSON object's text)}]."""
    if not isinstance(value, list):
        raise _invalid(param, f"expected a list of tool calls, got {_preview(value)}", "invalid_type")
    calls = []
    for i, call in enumerate(value):
        where = f"{param}[{i}]"
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or call.get("type", "function") != "function":
            raise _invalid(where, f"expected {{\"type\": \"function\", \"function\": {{\"name\", \"arguments\"}}}}, "
                           f"got {_preview(call)}", "invalid_type")
        name, arguments = function.get("name"), function.get("arguments")
        if not isinstance(name, str) or not name:
            raise _invalid(f"{where}.function.name", f"expected a non-empty string, got {_preview(name)}")
        if not isinstance(arguments, str):
            raise _invalid(f"{where}.function.arguments",
                           f"expected a JSON object as a string, got {_preview(arguments)}", "invalid_type")
        try:
            if not isinstance(json.loads(arguments), dict):
                raise ValueError("not an object")
        except RecursionError:
            raise _invalid(f"{where}.function.arguments", "expected a JSON object as a string, got one nested too "
                           "deeply") from None
        except ValueError as err:
            raise _invalid(f"{where}.function.arguments", f"expected a JSON object as a string ({err}), got "
                           f"{_preview(arguments)}") from None
        tally.text(name + arguments, f"{where}.function")
        calls.append({"name": name, "arguments": arguments})
    return calls


def _tools(value: Any, tally: _Tally) -> list[dict[str, Any]]:
    """Returns the request's tool definitions, checked ({"type": "function", "function": {"name", ...}})."""
    if not isinstance(value, list) or not value:
        raise _invalid("tools", f"expected a non-empty list of tools, got {_preview(value)}", "invalid_type")
    for i, tool in enumerate(value):
        where = f"tools[{i}]"
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(function, dict) or tool.get("type") != "function":
            raise _invalid(where, f"expected {{\"type\": \"function\", \"function\": {{\"name\", ...}}}}, got "
                           f"{_preview(tool)}", "invalid_type")
        if not isinstance(function.get("name"), str) or not function["name"]:
            raise _invalid(f"{where}.function.name",
                           f"expected a non-empty string, got {_preview(function.get('name'))}")
        if function.get("strict"):
            raise _invalid(f"{where}.function.strict", "strict (schema-constrained) arguments are not implemented; "
                           "expected false or null", "unsupported_parameter")
        tally.text(json.dumps(tool, ensure_ascii=False), where)
    return value


def _refuse_unimplemented(body: dict) -> None:
    """Raises RequestError naming the first field this server would otherwise ignore."""
    for key, value in body.items():
        if key in IMPLEMENTED_FIELDS or value is None:
            continue
        if key in IGNORED_FIELDS:
            if not isinstance(value, IGNORED_FIELDS[key]):
                raise _invalid(key, f"expected {IGNORED_FIELDS[key].__name__}, got {_preview(value)}", "invalid_type")
            continue
        if key in NO_OP_VALUES:
            no_ops, hint = NO_OP_VALUES[key]
            if any(value == v and type(value) is not bool or value is v for v in no_ops):
                continue
            raise _invalid(key, f"{hint}, got {_preview(value)}", "unsupported_parameter")
        raise _invalid(key, "this server does not implement this field; leave it out or send null (it implements "
                       f"{', '.join(IMPLEMENTED_FIELDS)})", "unsupported_parameter")


def _flag(body: dict, key: str) -> bool:
    value = body.get(key)
    if value is not None and not isinstance(value, bool):
        raise _invalid(key, f"expected true or false, got {_preview(value)}", "invalid_type")
    return bool(value)


def parse_chat_request(body: Any, *, model_name: str, max_tokens_limit: int, default_max_tokens: int,
                       max_image_pixels: int, max_prompt_bytes: int, max_n: int) -> ChatRequest:
    """Returns the checked request for a decoded JSON `body`; raises RequestError naming the field.

    Refuses images of more than `max_image_pixels` pixels and text of more than `max_prompt_bytes`
    UTF-8 bytes (code image_too_large / prompt_too_long) before decoding or tokenizing them.
    """
    if not isinstance(body, dict):
        raise RequestError(400, f"request body: expected a JSON object, got {type(body).__name__}", code="invalid_type")
    model = body.get("model")
    if model is None:
        raise RequestError(400, "model: required field is missing", param="model", code="missing_field")
    if model != model_name:
        raise RequestError(404, f"model: {_preview(model)} is not served here; this server serves {model_name!r}",
                           param="model", code="model_not_found")
    _refuse_unimplemented(body)
    stream = _flag(body, "stream")
    options = body.get("stream_options")
    if options is not None:
        if not stream:
            raise _invalid("stream_options", "only allowed with \"stream\": true")
        if not isinstance(options, dict) or set(options) - {"include_usage"}:
            raise _invalid("stream_options", f"expected {{\"include_usage\": true | false}}, got {_preview(options)}",
                           "unsupported_parameter")
    include_usage = _flag(options or {}, "include_usage")
    n = _integer(body, "n")
    if n is not None and not 1 <= n <= max_n:
        raise _invalid("n", f"expected an integer in [1, {max_n}] (this server's limit), got {n}")
    logprobs = _flag(body, "logprobs")
    top_logprobs = _integer(body, "top_logprobs", 0, MAX_TOP_LOGPROBS) or 0
    if top_logprobs and not logprobs:
        raise _invalid("top_logprobs", "only allowed with \"logprobs\": true")
    user = body.get("user")
    if user is not None and not isinstance(user, str):
        raise _invalid("user", f"expected a string, got {_preview(user)}", "invalid_type")
    tally = _Tally(max_image_pixels, max_prompt_bytes)
    messages = _messages(body.get("messages"), tally)
    tool_choice = body.get("tool_choice")
    if tool_choice is not None and tool_choice not in TOOL_CHOICES:
        raise _invalid("tool_choice", f"expected one of {list(TOOL_CHOICES)} (forcing a call needs constrained "
                       f"decoding, which this server does not implement), got {_preview(tool_choice)}",
                       "unsupported_parameter")
    parallel = body.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise _invalid("parallel_tool_calls", f"expected true or false, got {_preview(parallel)}", "invalid_type")
    tools = _tools(body["tools"], tally) if body.get("tools") is not None else None
    if tool_choice == "none":  # the model is told of no tool, and its reply is not parsed for calls
        tools = None
    tool_turns = bool(tools) or any(m["role"] == "tool" or m.get("tool_calls") for m in messages)
    messages = plain_messages(messages, tools)
    key = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = _integer(body, key)
    if max_tokens is None:
        max_tokens = default_max_tokens
    elif not 1 <= max_tokens <= max_tokens_limit:
        raise _invalid(key, f"expected an integer in [1, {max_tokens_limit}], got {max_tokens}")
    temperature = _number(body, "temperature", 1.0, 0.0, 2.0)  # OpenAI's and vLLM's default
    top_p = _number(body, "top_p", 1.0, 0.0, 1.0, open_low=True)
    top_k = _integer(body, "top_k", -1, MAX_TOP_K)  # vLLM's extension; -1 there means "off", as 0 does here
    seed = _integer(body, "seed", *INT64)
    stop = body.get("stop")
    if stop is None:
        stop = ()
    elif isinstance(stop, str):
        stop = (stop,)
    elif isinstance(stop, list) and all(isinstance(s, str) for s in stop) and len(stop) <= MAX_STOP_STRINGS:
        stop = tuple(stop)
    else:
        raise _invalid("stop", f"expected a string or a list of at most {MAX_STOP_STRINGS} strings, got {_preview(stop)}")
    if any(not s for s in stop):
        raise _invalid("stop", "stop strings must not be empty")
    params = SamplingParams(max_new_tokens=max_tokens, temperature=temperature, top_p=top_p,
                            top_k=max(top_k or 0, 0))
    return ChatRequest(messages=messages, params=params, seed=None if seed is None else seed % SEED_MODULUS,
                       stop=stop, image_sizes=tuple(tally.image_sizes), text_bytes=tally.text_bytes, n=n or 1,
                       stream=stream, include_usage=include_usage, logprobs=logprobs, top_logprobs=top_logprobs,
                       parse_tool_calls=tools is not None, parallel_tool_calls=parallel is not False,
                       ignored=tuple(k for k in IGNORED_FIELDS if body.get(k) is not None), tool_turns=tool_turns,
                       user=user)
