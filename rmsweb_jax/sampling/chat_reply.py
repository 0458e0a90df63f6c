"""The OpenAI objects a ChatServer answers with: `chat.completion`, or its `chat.completion.chunk` stream, with
log-probs and tool calls.

A choice's text is cut at the request's first stop string, then (when the request has tools) split into
content and tool calls (`tool_calls.parse_tool_calls`, finish "tool_calls"). Log-probs cover the tokens
that wrote the returned text, tool-call blocks included (as vLLM's), and not the stop token that ended
the turn; each is the sampler's: the token's log-probability under the temperature-scaled distribution
(temperature 0: the model's own), before top-k / top-p truncation.

Streaming: the sampler decodes a whole batch in one compiled loop, so chunks are written once the
generation is done, one per token (a token that ends mid-character writes "" and the next writes the
character). What the stream carries adds up to the non-streamed reply: the same content, tool calls,
finish reason and usage.
"""
from __future__ import annotations

import codecs
import dataclasses
import functools
from typing import Any, Sequence

from rmsweb_jax.sampling.tool_calls import parse_tool_calls


@functools.lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    """Returns GPT-2's byte-level BPE map from the printable character of a byte back to the byte."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(
        range(ord("®"), ord("ÿ") + 1))
    chars, extra = list(printable), 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars)}


class TokenText:
    """A token's bytes and the text pieces a run of tokens decodes to, as `tokenizer.decode(ids,
    skip_special_tokens=True)` writes them (special tokens: no bytes; added tokens: their own text)."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self._special = set(tokenizer.all_special_ids)
        self._added = {int(i): name for name, i in tokenizer.get_added_vocab().items()}

    @functools.lru_cache(maxsize=1 << 16)
    def token_bytes(self, token_id: int) -> bytes:
        """Returns the bytes token `token_id` adds to decoded text (b"" for a special token)."""
        if token_id in self._special:
            return b""
        if token_id in self._added:
            return self._added[token_id].encode()
        symbol = self.tokenizer.convert_ids_to_tokens(int(token_id))
        decoder = _byte_decoder()
        if symbol is not None and all(ch in decoder for ch in symbol):
            return bytes(decoder[ch] for ch in symbol)
        # Not a byte-level symbol, or no token at all (a model's vocabulary may be padded past the tokenizer's).
        return self.tokenizer.decode([int(token_id)]).encode()

    def pieces(self, token_ids: Sequence[int], text: str) -> list[str] | None:
        """Returns the text each token adds, joining to `text` (the ids' decode), or None when its bytes do not
        decode to `text` (a tokenizer that is not byte-level BPE). A character split over tokens is added
        by the token that completes it."""
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        pieces = [decoder.decode(self.token_bytes(int(t))) for t in token_ids]
        tail = decoder.decode(b"", final=True)
        if pieces:
            pieces[-1] += tail
        return pieces if "".join(pieces) == text else None


@dataclasses.dataclass(frozen=True)
class ChoiceReply:
    """One choice as the client sees it: content (None: only tool calls), tool calls, finish reason, and per
    token of the returned text its piece of text and log-prob entry (None: not asked for)."""

    index: int
    content: str | None
    tool_calls: list[dict[str, Any]]
    finish_reason: str
    pieces: list[str] | None  # None: the tokenizer's pieces do not add up; the stream sends the text at once
    logprobs: list[dict[str, Any]] | None


def choice_reply(index: int, completion, stop: Sequence[str], *, parse_tools: bool, logprobs: bool,
                 top_logprobs: Sequence[Sequence[tuple[int, float]]] | None, token_text: TokenText | None,
                 parallel_tool_calls: bool = True) -> ChoiceReply:
    """Returns the reply of one Completion: cut at the first of `stop`, split into tool calls when
    `parse_tools` (the first only unless `parallel_tool_calls`), with log-prob entries when `logprobs` (and
    `top_logprobs`: per token (id, log-prob) of the most likely tokens). `token_text` is needed for pieces and
    log-probs (None: neither)."""
    ended_by_token = completion.finish_reason == "stop"
    ids = completion.token_ids[:-1] if ended_by_token else completion.token_ids
    text, finish = _apply_stop(completion.text, completion.finish_reason, stop)
    pieces = token_text.pieces(ids, completion.text) if token_text is not None else None
    content, calls = parse_tool_calls(text) if parse_tools else (text, [])
    calls = calls if parallel_tool_calls else calls[:1]
    if calls:
        finish = "tool_calls"
    entries = None
    if logprobs and token_text is not None:
        count = len(ids) if pieces is None else _tokens_covering(pieces, len(text))
        entries = [_entry(token_text, int(ids[i]), completion.logprobs[i],
                          top_logprobs[i] if top_logprobs is not None else ()) for i in range(count)]
    return ChoiceReply(index, content, calls, finish, pieces, entries)


def _apply_stop(text: str, finish_reason: str, stop: Sequence[str]) -> tuple[str, str]:
    """Returns the text cut before the first stop string (finish "stop"), else unchanged."""
    cuts = [i for i in (text.find(s) for s in stop) if i >= 0]
    return (text[:min(cuts)], "stop") if cuts else (text, finish_reason)


def _tokens_covering(pieces: Sequence[str], length: int) -> int:
    """Returns how many leading tokens it takes to write the first `length` characters."""
    written = 0
    for i, piece in enumerate(pieces):
        if written >= length:
            return i
        written += len(piece)
    return len(pieces)


def _token_entry(token_text: TokenText, token_id: int, logprob: float) -> dict[str, Any]:
    data = token_text.token_bytes(token_id)
    return {"token": data.decode("utf-8", errors="replace"), "logprob": float(logprob), "bytes": list(data)}


def _entry(token_text: TokenText, token_id: int, logprob: float, top: Sequence[tuple[int, float]]) -> dict[str, Any]:
    return {**_token_entry(token_text, token_id, logprob),
            "top_logprobs": [_token_entry(token_text, int(t), lp) for t, lp in top]}


def completion_object(reply_id: str, created: int, model: str, choices: Sequence[ChoiceReply],
                      usage: dict[str, int]) -> dict[str, Any]:
    """Returns the `chat.completion` object."""
    out = []
    for c in choices:
        message: dict[str, Any] = {"role": "assistant", "content": c.content}
        if c.tool_calls:
            message["tool_calls"] = c.tool_calls
        out.append({"index": c.index, "message": message, "finish_reason": c.finish_reason,
                    "logprobs": None if c.logprobs is None else {"content": c.logprobs, "refusal": None}})
    return {"id": reply_id, "object": "chat.completion", "created": created, "model": model, "choices": out,
            "usage": usage}


def chunk_objects(reply_id: str, created: int, model: str, choices: Sequence[ChoiceReply], usage: dict[str, int],
                  include_usage: bool) -> list[dict[str, Any]]:
    """Returns the `chat.completion.chunk` objects of a streamed reply, in order: per choice a role chunk, a
    chunk per token of its content, one with its tool calls (if any) and one with its finish reason; then,
    with `include_usage`, a last chunk of no choices carrying the usage (every other chunk's usage is null)."""
    def chunk(index: int, delta: dict, finish: str | None = None, logprobs: list | None = None) -> dict:
        body = {"id": reply_id, "object": "chat.completion.chunk", "created": created, "model": model,
                "choices": [{"index": index, "delta": delta, "finish_reason": finish,
                             "logprobs": None if logprobs is None else {"content": logprobs, "refusal": None}}]}
        return {**body, "usage": None} if include_usage else body

    chunks = []
    for c in choices:
        chunks.append(chunk(c.index, {"role": "assistant", "content": ""}))
        content = c.content or ""
        if c.pieces is None:
            if content:
                chunks.append(chunk(c.index, {"content": content}, logprobs=c.logprobs))
        else:
            written = 0
            for i in range(_tokens_covering(c.pieces, len(content))):
                piece = c.pieces[i][:max(0, len(content) - written)]
                written += len(c.pieces[i])
                chunks.append(chunk(c.index, {"content": piece},
                                    logprobs=None if c.logprobs is None else c.logprobs[i:i + 1]))
        if c.tool_calls:
            chunks.append(chunk(c.index, {"tool_calls": [{"index": i, **call} for i, call in enumerate(c.tool_calls)]}))
        chunks.append(chunk(c.index, {}, c.finish_reason))
    if include_usage:
        chunks.append({"id": reply_id, "object": "chat.completion.chunk", "created": created, "model": model,
                       "choices": [], "usage": usage})
    return chunks
