"""What every LLM judge shares: the chat callable, message parts, the attempt's screenshots and
action history as judges show them, and tolerant readers for the judge model's text.

A judge talks to its model through `chat(messages) -> reply`, messages in OpenAI chat format
(content parts {"type": "text"} and {"type": "image_url"} with PNG data URLs). The reply is the
text, or an object with `.text`, `.prompt_tokens` and `.completion_tokens` (what
`chat_from_client` returns over an OpenAI-compatible endpoint: the server's token counts); a
judgement's Verdict carries the calls and the token sums (0 for plain-text replies), the judge's
share of the accuracy-cost trade-off. A call that raises, or returns neither, ends the judgement
as a recorded error (`JudgeFailure` → Verdict(outcome="error")), never as a success.
"""
from __future__ import annotations

import base64
import json
import re
import threading
from typing import Any, Callable, Protocol, Sequence

from rmsweb_jax.judges.base import ERROR, JudgeInput, Verdict
from rmsweb_jax.web.action_text import CLOSE, OPEN


class ChatReply(Protocol):
    """A reply with the server's token counts (agents.chat_client.ChatResult is one)."""

    text: str
    prompt_tokens: int
    completion_tokens: int


Chat = Callable[[list[dict]], "str | ChatReply"]


class JudgeFailure(Exception):
    """The judge could not decide: the endpoint failed or its text could not be read. `reason`
    names what went wrong and what was expected; `raw` keeps the text at fault."""

    def __init__(self, reason: str, raw: str = ""):
        super().__init__(reason)
        self.reason, self.raw = reason, raw


class EmptyReply(RuntimeError):
    """A reply with no text (cut at max_tokens): a failed call whose tokens were still spent;
    `reply` keeps the counts."""

    def __init__(self, message: str, reply: ChatReply):
        super().__init__(message)
        self.reply = reply


class ChatSession:
    """Counts the calls one judgement makes and the tokens their replies report, and turns
    endpoint failures into JudgeFailure.

    The counters are guarded by a lock: WebJudge scores screenshots from worker threads. A call
    that fails still counts as a call (the endpoint was asked); its tokens count only when the
    server reported them (an empty reply cut at max_tokens, EmptyReply), else they are unknown (0).
    """

    def __init__(self, chat: Chat):
        self._chat, self._lock = chat, threading.Lock()
        self.calls = self.prompt_tokens = self.completion_tokens = 0

    def ask(self, messages: list[dict], what: str) -> str:
        """Returns the model's text for `messages`; raises JudgeFailure naming `what` was asked."""
        with self._lock:
            self.calls += 1
        try:
            reply = self._chat(messages)
        except EmptyReply as e:
            self._count(e.reply)
            raise JudgeFailure(f"{what}: judge endpoint call failed: {e}") from None
        except Exception as e:  # noqa: BLE001 — any transport failure is a judge error, not a crash
            raise JudgeFailure(f"{what}: judge endpoint call failed: {type(e).__name__}: {e}") from None
        if isinstance(reply, str):
            return reply
        if not isinstance(getattr(reply, "text", None), str) or not self._count(reply):
            raise JudgeFailure(f"{what}: judge endpoint returned {type(reply).__name__}; expected the reply text (str) "
                               "or an object with .text (str), .prompt_tokens and .completion_tokens (ints >= 0)")
        return reply.text

    def _count(self, reply: ChatReply) -> bool:
        """Adds the reply's token counts; returns False (adding nothing) when they are not ints >= 0."""
        tokens = (getattr(reply, "prompt_tokens", None), getattr(reply, "completion_tokens", None))
        if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in tokens):
            return False
        with self._lock:
            self.prompt_tokens += tokens[0]
            self.completion_tokens += tokens[1]
        return True

    def verdict(self, outcome: str, **fields: Any) -> Verdict:
        """Returns a Verdict carrying this session's calls and token sums besides `fields`."""
        return Verdict(outcome=outcome, calls=self.calls, prompt_tokens=self.prompt_tokens,
                       completion_tokens=self.completion_tokens, **fields)


def error_verdict(judge: str, failure: JudgeFailure, session: ChatSession) -> Verdict:
    """Returns the error verdict for a failed judgement, with the calls and tokens `session` spent."""
    return session.verdict(ERROR, reason=failure.reason, raw=failure.raw, judge=judge)


def chat_from_client(client: Any, *, max_tokens: int = 1024, temperature: float = 0.0) -> Chat:
    """Returns a chat callable over an rmsweb_jax.agents.chat_client.ChatClient (or anything with
    the same `complete(messages, max_tokens=, temperature=) -> ChatResult` method); it returns the
    ChatResult itself (text and token counts).

    A reply cut at `max_tokens` with no text raises, so it is recorded as a judge error rather
    than parsed as an empty verdict."""
    # Duck-typed on purpose: judges never import the HTTP client, so they load without it.
    if not callable(getattr(client, "complete", None)):
        raise TypeError(f"client must have a complete(messages, max_tokens=, temperature=) method (a ChatClient), "
                        f"got {type(client).__name__}")
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens!r}")

    def chat(messages: list[dict]) -> ChatReply:
        result = client.complete(messages, max_tokens=max_tokens, temperature=temperature)
        if not result.text and result.finish_reason == "length":
            raise EmptyReply(f"empty reply cut at max_tokens={max_tokens} (finish_reason 'length')", result)
        return result  # text and the server's token counts: ChatSession sums them into the Verdict

    return chat


# --- message parts --------------------------------------------------------------------------------
def text_part(text: str) -> dict:
    """Returns an OpenAI text content part."""
    return {"type": "text", "text": text}


def image_part(png: bytes, *, detail: str | None = None, mime: str = "image/png") -> dict:
    """Returns an OpenAI image_url content part carrying `png` as a base64 data URL."""
    if not isinstance(png, (bytes, bytearray)) or not png:
        raise ValueError(f"image_part: expected non-empty image bytes, got {type(png).__name__} of length "
                         f"{len(png) if isinstance(png, (bytes, bytearray)) else 'n/a'}")
    url = {"url": f"data:{mime};base64,{base64.b64encode(bytes(png)).decode('ascii')}"}
    if detail is not None:
        url["detail"] = detail
    return {"type": "image_url", "image_url": url}


def image_bytes(part: dict) -> bytes:
    """Returns the image bytes of an image_url part built by `image_part` (for reports and tests)."""
    url = part["image_url"]["url"]
    return base64.b64decode(url.split(",", 1)[1])


# --- the attempt as judges see it -----------------------------------------------------------------
def tool_arguments(action_text: str) -> dict | None:
    """Returns the "arguments" object of the tool call in `action_text`, or None when there is no
    readable call. Lenient on purpose (no coordinate-range check): judges describe what the agent
    wrote, valid or not."""
    start = action_text.find(OPEN)
    if start < 0:
        return None
    body = action_text[start + len(OPEN):]
    end = body.find(CLOSE)
    body = body[:end] if end >= 0 else body
    try:
        payload = json.loads(body)
        args = payload.get("arguments") if isinstance(payload, dict) else None
        if isinstance(args, str):
            args = json.loads(args)
    except (ValueError, RecursionError):
        return None
    return args if isinstance(args, dict) else None


def describe_action(action_text: str) -> str:
    """Returns one line for an action in a judge's action history: `name {"arg": value, ...}`, or the
    agent's text squeezed onto one line when it holds no readable tool call."""
    args = tool_arguments(action_text)
    if args is None or not isinstance(args.get("action"), str):
        body = action_text.replace(OPEN, " ").replace(CLOSE, " ")
        return " ".join(body.split()) or "(empty action)"
    rest = {k: v for k, v in args.items() if k != "action"}
    return f"{args['action']} {json.dumps(rest, ensure_ascii=False)}" if rest else args["action"]


def is_answer(action_text: str) -> bool:
    """Returns whether `action_text` is a closing `answer` action."""
    args = tool_arguments(action_text)
    return args is not None and args.get("action") == "answer"


def action_history(attempt: JudgeInput, *, drop_answer: bool = True) -> list[str]:
    """Returns one line per step's action, oldest first. `drop_answer` leaves out closing answer
    actions: Online-Mind2Web asks for "only factual actions, not agent outputs" (the answer text
    may be hallucinated and inflates false positives)."""
    return [describe_action(s.action_text) for s in attempt.steps if not (drop_answer and is_answer(s.action_text))]


def trajectory_screenshots(attempt: JudgeInput) -> list[bytes]:
    """Returns the attempt's screenshots in order: each step's, then the page after the last action
    unless that adds nothing (no final screenshot, the last step was an answer — which leaves the
    page as it was — or the bytes equal the last step's)."""
    shots = [s.screenshot for s in attempt.steps if s.screenshot]
    final = attempt.final_screenshot
    last = attempt.steps[-1] if attempt.steps else None
    if final and not (last is not None and (is_answer(last.action_text) or final == last.screenshot)):
        shots.append(final)
    return shots


def task_text(attempt: JudgeInput) -> str:
    """Returns the task as the judge is shown it: the attempt's instruction, else the Task's."""
    text = (attempt.instruction or getattr(attempt.task, "instruction", "") or "").strip()
    if not text:
        raise JudgeFailure("attempt has no instruction (JudgeInput.instruction and task.instruction are empty); "
                           "expected the task text the agent was given")
    return text


# --- reading the judge model's text ---------------------------------------------------------------
_FENCE = re.compile(r"```(?:json|JSON)?\s*(.*?)```", re.S)


def json_object(text: str) -> dict:
    """Returns the first JSON object in `text` (bare, or inside a ```json fence, after any prose).
    Raises ValueError saying what was found instead."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError("empty reply; expected a JSON object")
    candidates = [m.group(1) for m in _FENCE.finditer(text)] + [text]
    decoder = json.JSONDecoder()
    last_error = "no '{' found"
    for candidate in candidates:
        pos = candidate.find("{")
        while pos >= 0:
            try:
                value, _ = decoder.raw_decode(candidate, pos)
            except ValueError as e:
                last_error = f"{e}"
            else:
                if isinstance(value, dict):
                    return value
            pos = candidate.find("{", pos + 1)
    raise ValueError(f"no complete JSON object in the reply ({last_error})")


def preview(text: str, limit: int = 120) -> str:
    """Returns `text` shortened for an error message."""
    text = " ".join(str(text).split())
    return repr(text if len(text) <= limit else text[:limit] + "...")


def numbered(lines: Sequence[str]) -> str:
    """Returns lines as "1. a\\n2. b" (the official judges' list form)."""
    return "\n".join(f"{i + 1}. {line}" for i, line in enumerate(lines))
