"""The chat-completions request a ChatServer accepts: parsed, checked, and normalized.

Each check names the field at fault (`messages[2].content[1].image_url.url`) in an
OpenAI-style error. Fields the server does not use (tools, penalties, user, ...) are ignored,
as OpenAI-compatible servers do; fields whose meaning it cannot honour (stream, n > 1,
logprobs) are refused rather than silently dropped.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any

from rmsweb_jax.processing.chat import decode_image_part
from rmsweb_jax.sampling.sampler import SamplingParams

ROLES = ("system", "user", "assistant")
MAX_STOP_STRINGS = 4


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
    parts), the sampling settings, the seed (None: the server picks one) and stop strings."""

    messages: list
    params: SamplingParams
    seed: int | None = None
    stop: tuple[str, ...] = ()


def _invalid(param: str, message: str, code: str = "invalid_value") -> RequestError:
    return RequestError(400, f"{param}: {message}", param=param, code=code)


def _number(body: dict, key: str, default: float, low: float, high: float, *, open_low: bool = False) -> float:
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise _invalid(key, f"expected a number, got {value!r}", "invalid_type")
    if value > high or value < low or (open_low and value == low):
        bracket = "(" if open_low else "["
        raise _invalid(key, f"expected a number in {bracket}{low:g}, {high:g}], got {value!r}")
    return float(value)


def _integer(body: dict, key: str) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise _invalid(key, f"expected an integer, got {value!r}", "invalid_type")
    return value


def check_image_url(url: Any, param: str) -> None:
    """Raises RequestError unless `url` is a data:image/...;base64 URL of a decodable image."""
    if not isinstance(url, str):
        raise _invalid(param, f"expected a string, got {type(url).__name__}", "invalid_type")
    try:  # the same rules the model's prompt encoder applies, checked before the request queues
        decode_image_part({"type": "image_url", "image_url": {"url": url}})
    except ValueError as e:
        raise _invalid(param, str(e), "invalid_image") from None


def _content(content: Any, param: str, role: str) -> str | list[dict[str, Any]]:
    """Returns the content normalized: a str, or a list of text / image_url parts."""
    if content is None:
        return ""
    if isinstance(content, str):
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
                raise _invalid(f"{where}.text", f"expected a string, got {part.get('text')!r:.60}", "invalid_type")
            parts.append({"type": "text", "text": part["text"]})
        elif kind == "image_url":
            if role != "user":  # chat templates drop images of other turns: refuse, not lose pixels
                raise _invalid(where, f"images are accepted only in user messages, not in a {role} message")
            image = part.get("image_url")
            url = image.get("url") if isinstance(image, dict) else image
            check_image_url(url, f"{where}.image_url.url")
            parts.append({"type": "image_url", "image_url": {"url": url}})
        else:
            raise _invalid(f"{where}.type", f"expected 'text' or 'image_url', got {kind!r}")
    return parts


def _messages(value: Any) -> list[dict[str, Any]]:
    if value is None:
        raise RequestError(400, "messages: required field is missing", param="messages", code="missing_field")
    if not isinstance(value, list) or not value:
        raise _invalid("messages", f"expected a non-empty list of messages, got {value!r:.80}")
    messages = []
    for i, message in enumerate(value):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise _invalid(where, f"expected an object, got {type(message).__name__}", "invalid_type")
        role = message.get("role")
        if role not in ROLES:
            raise _invalid(f"{where}.role", f"expected one of {list(ROLES)}, got {role!r}")
        if "content" not in message:
            raise RequestError(400, f"{where}.content: required field is missing", param=f"{where}.content",
                               code="missing_field")
        messages.append({"role": role, "content": _content(message["content"], f"{where}.content", role)})
    return messages


def parse_chat_request(body: Any, *, model_name: str, max_tokens_limit: int, default_max_tokens: int) -> ChatRequest:
    """Returns the checked request for a decoded JSON `body`; raises RequestError naming the field."""
    if not isinstance(body, dict):
        raise RequestError(400, f"request body: expected a JSON object, got {type(body).__name__}", code="invalid_type")
    model = body.get("model")
    if model is None:
        raise RequestError(400, "model: required field is missing", param="model", code="missing_field")
    if model != model_name:
        raise RequestError(404, f"model: {model!r} is not served here; this server serves {model_name!r}",
                           param="model", code="model_not_found")
    if body.get("stream"):
        raise _invalid("stream", "streaming is not supported; send \"stream\": false", "unsupported_value")
    n = _integer(body, "n")
    if n is not None and n != 1:
        raise _invalid("n", f"only n = 1 is supported, got {n}", "unsupported_value")
    if body.get("logprobs"):
        raise _invalid("logprobs", "log-probabilities are not returned by this server", "unsupported_value")
    messages = _messages(body.get("messages"))
    key = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = _integer(body, key)
    if max_tokens is None:
        max_tokens = default_max_tokens
    elif not 1 <= max_tokens <= max_tokens_limit:
        raise _invalid(key, f"expected an integer in [1, {max_tokens_limit}], got {max_tokens}")
    temperature = _number(body, "temperature", 0.0, 0.0, 2.0)
    top_p = _number(body, "top_p", 1.0, 0.0, 1.0, open_low=True)
    top_k = _integer(body, "top_k")  # vLLM's extension; -1 there means "off", as 0 does here
    if top_k is not None and top_k < -1:
        raise _invalid("top_k", f"expected an integer >= -1, got {top_k}")
    seed = _integer(body, "seed")
    stop = body.get("stop")
    if stop is None:
        stop = ()
    elif isinstance(stop, str):
        stop = (stop,)
    elif isinstance(stop, list) and all(isinstance(s, str) for s in stop) and len(stop) <= MAX_STOP_STRINGS:
        stop = tuple(stop)
    else:
        raise _invalid("stop", f"expected a string or a list of at most {MAX_STOP_STRINGS} strings, got {stop!r:.80}")
    if any(not s for s in stop):
        raise _invalid("stop", "stop strings must not be empty")
    params = SamplingParams(max_new_tokens=max_tokens, temperature=temperature, top_p=top_p,
                            top_k=max(top_k or 0, 0))
    return ChatRequest(messages=messages, params=params, seed=seed, stop=stop)
