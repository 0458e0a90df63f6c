"""PromptBudget: a checked request's prompt length, counted on the request's own thread.

ChatModel.complete would refuse a prompt longer than its largest length bucket, but only on the
server's one batch thread, after tokenizing it and preprocessing its images: every request queued
behind it waits, and a huge prompt costs its tokenizer memory there. Counting first, on the
request's thread, refuses such a request before it queues, at the cost of tokenizing the text
once more (a few ms for a screenshot prompt). Images are counted from their sizes, exactly as the
image processor will resize them, without decoding a pixel.
"""
from __future__ import annotations

import contextlib
import threading
from typing import Any

from PIL import Image

from rmsweb_jax.processing.chat import render_chat
from rmsweb_jax.processing.image import num_image_tokens, smart_resize
from rmsweb_jax.processing.prompt_tokens import encode_multimodal
from rmsweb_jax.sampling.chat_request import ChatRequest, RequestError

# render_chat needs an image object per image part; the count of placeholders is all it uses.
_PLACEHOLDER = Image.new("L", (1, 1))
# Prompts with more text than this are counted one at a time (see PromptBudget.__init__).
LARGE_PROMPT_BYTES = 64 << 10


class PromptBudget:
    """Counts prompt tokens as `chat_model.encode` would (same template, same image grids).

    `chat_model` needs `.tokenizer`, `.image_config` and `.max_prompt_tokens`.
    """

    def __init__(self, chat_model):
        self.tokenizer = chat_model.tokenizer
        self.image_config = chat_model.image_config
        self.max_prompt_tokens = int(chat_model.max_prompt_tokens)
        # Large prompts are counted one at a time: their tokens take memory while counted (bounded
        # by the server's max_prompt_bytes), and concurrent counts would multiply it. Small ones
        # skip the lock, so they never wait behind a large one.
        self._large = threading.Lock()

    def check(self, request: ChatRequest) -> int:
        """Returns the request's prompt tokens; raises RequestError (400) when the model would refuse it."""
        n = len(self.prompt_ids(request))
        if n > self.max_prompt_tokens:
            raise self._too_long(f"it is {n} tokens")
        return n

    def prompt_ids(self, request: ChatRequest) -> list[int]:
        """Returns the request's prompt token ids as the model reads them (each image's placeholders expanded to
        its token count); raises RequestError (400) for images past the budget or a conversation it cannot
        encode."""
        grids = [self._grid(width, height, i) for i, (width, height) in enumerate(request.image_sizes)]
        merge = self.image_config.merge_size
        image_tokens = sum(num_image_tokens(g, merge) for g in grids)
        if image_tokens > self.max_prompt_tokens:  # refused before tokenizing anything
            raise self._too_long(f"its {len(grids)} image(s) alone take {image_tokens} tokens")
        with self._large if request.text_bytes > LARGE_PROMPT_BYTES else contextlib.nullcontext():
            try:
                text, _ = render_chat(self.tokenizer, _with_placeholders(request.messages), add_generation_prompt=True)
                ids, _ = encode_multimodal(self.tokenizer, text, grids or None, merge_size=merge)
            except ValueError as e:
                raise RequestError(400, f"messages: the model cannot encode this conversation: {e}", param="messages",
                                   code="invalid_prompt") from None
        return [int(i) for i in ids]

    def _grid(self, width: int, height: int, index: int) -> tuple[int, int, int]:
        config = self.image_config
        if min(width, height) < config.min_side:
            raise RequestError(400, f"messages: image {index} of {width}x{height} is below the minimum size: both "
                               f"sides must be >= {config.min_side} pixels", param="messages", code="invalid_image")
        try:
            h, w = smart_resize(height, width, config.factor, config.min_pixels, config.max_pixels)
        except ValueError as e:  # too elongated
            raise RequestError(400, f"messages: image {index}: {e}", param="messages", code="invalid_image") from None
        return (1, h // config.patch_size, w // config.patch_size)

    def _too_long(self, why: str) -> RequestError:
        return RequestError(400, f"messages: the prompt is too long for this model: {why}, and it takes at most "
                            f"{self.max_prompt_tokens} (its largest length bucket); send a shorter conversation",
                            param="messages", code="prompt_too_long")


def _with_placeholders(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Returns the messages with each image_url part replaced by an undecoded placeholder image."""
    return [m if isinstance(m["content"], str) else
            {"role": m["role"], "content": [{"type": "image", "image": _PLACEHOLDER} if p["type"] == "image_url" else p
                                            for p in m["content"]]}
            for m in messages]
