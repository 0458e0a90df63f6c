"""LLM-judge replies cached by a hash of the exact request, so a re-scored or replayed trajectory is judged
again without the judge endpoint.

The key is the sha256 of the request as JSON with sorted keys: the messages (prompt text and every
image's bytes, as data URLs), the judge model and its settings (max_tokens, temperature). The same
trajectory under the same judge prompt asks the same request and gets the recorded reply; any change
(a new prompt, another screenshot, another model or temperature) is another key and goes to the
endpoint, and its reply is cached in turn. The endpoint's address is not in the key: a cache outlives
the host that answered it.

One file per reply (<key>.json: text and the server's token counts), written through a temp file and a
rename, so concurrent judgements and a killed run never leave half a reply.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import pathlib
from typing import Any, Sequence

from rmsweb_jax.judges.llm import Chat, ChatReply

CACHE_DIR = "judge_cache"  # the cache's folder inside a trajectory store


@dataclasses.dataclass(frozen=True)
class CachedReply:
    """A reply read from the cache: the text and the token counts the server reported then."""

    text: str
    prompt_tokens: int
    completion_tokens: int


class JudgeCache:
    """Replies under `directory` (written there), also looked up in `read_also` (e.g. the cache of the
    store a replay comes from). `hits` and `misses` count lookups."""

    def __init__(self, directory: str | os.PathLike, read_also: Sequence[str | os.PathLike] = ()):
        self.directory = pathlib.Path(directory)
        self.read_also = tuple(pathlib.Path(d) for d in read_also)
        self.hits = self.misses = 0

    @staticmethod
    def key(request: dict[str, Any]) -> str:
        """Returns the hex sha256 of `request` as canonical JSON."""
        text = json.dumps(request, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()

    def get(self, key: str) -> CachedReply | None:
        """Returns the reply cached under `key`, or None."""
        for directory in (self.directory, *self.read_also):
            path = directory / f"{key}.json"
            if path.is_file():
                d = json.loads(path.read_text())
                self.hits += 1
                return CachedReply(d["text"], d["prompt_tokens"], d["completion_tokens"])
        self.misses += 1
        return None

    def put(self, key: str, reply: str | ChatReply) -> None:
        """Caches `reply` (its text and token counts; a plain string counts no tokens) under `key`."""
        self.directory.mkdir(parents=True, exist_ok=True)
        d = ({"text": reply, "prompt_tokens": 0, "completion_tokens": 0} if isinstance(reply, str) else
             {"text": reply.text, "prompt_tokens": reply.prompt_tokens, "completion_tokens": reply.completion_tokens})
        path = self.directory / f"{key}.json"
        tmp = path.with_name(f".tmp-{os.getpid()}-{key}.json")
        tmp.write_text(json.dumps(d))
        os.replace(tmp, path)


def cached_chat(chat: Chat, cache: JudgeCache, settings: dict[str, Any]) -> Chat:
    """Returns a chat callable that answers a request cached before from `cache` and asks `chat` (and
    caches its reply) otherwise; `settings` (the model, max_tokens, temperature) are part of the key.
    A failed call is not cached: the next judgement asks again."""
    def chat_cached(messages: list[dict]) -> str | ChatReply:
        key = JudgeCache.key({"messages": messages, **settings})
        reply = cache.get(key)
        if reply is None:
            reply = chat(messages)
            cache.put(key, reply)
        return reply

    return chat_cached
