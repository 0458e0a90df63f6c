"""OpenAI-format chat messages to model inputs: the checkpoint's chat template, images, loss masks.

Messages are OpenAI chat messages (role system / user / assistant; content a str or a list of
parts `{"type": "text", "text": ...}`, `{"type": "image_url", "image_url": {"url": "data:image/png;base64,..."}}`
or `{"type": "image", "image": <PNG bytes>}`). Sampling (`encode_chat`) and SFT
(`encode_for_training`) tokenize through the same template, so a trained prompt prefix is
token-for-token the prefix the sampler sees.
"""
from __future__ import annotations

import base64
import binascii
import dataclasses
import io
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from PIL import Image

from rmsweb_jax.processing.image import ImageProcessorConfig, preprocess_images
from rmsweb_jax.processing.prompt_tokens import IMAGE_TOKEN, encode_multimodal

ROLES = ("system", "user", "assistant")
MASK_MODES = ("thought_and_action", "action_only")
END_OF_TURN = "<|im_end|>"
TOOL_OPEN, TOOL_CLOSE = "<tool_call>", "</tool_call>"


@dataclasses.dataclass(frozen=True)
class EncodedChat:
    """One tokenized conversation: ids, token types (0 text, 1 image), image patches, loss mask.

    `pixel_values` float32 [P, D] and `image_grid_thw` int64 [N, 3] are None without images;
    `loss_mask` int32 [L] is set only by `encode_for_training`; `prompt_length` is the number of
    leading tokens that form the generation prompt (the whole sequence for `encode_chat`).
    """

    input_ids: np.ndarray
    token_types: np.ndarray
    pixel_values: np.ndarray | None = None
    image_grid_thw: np.ndarray | None = None
    loss_mask: np.ndarray | None = None
    prompt_length: int = 0

    @property
    def num_images(self) -> int:
        """Returns the number of images in the conversation."""
        return 0 if self.image_grid_thw is None else int(len(self.image_grid_thw))


def png_data_url(png: bytes) -> str:
    """Returns a `data:image/png;base64,...` URL for PNG bytes (how prompts carry screenshots)."""
    return "data:image/png;base64," + base64.b64encode(bytes(png)).decode("ascii")


def image_url_part(png: bytes) -> dict[str, Any]:
    """Returns an OpenAI `image_url` content part holding PNG bytes as a data URL."""
    return {"type": "image_url", "image_url": {"url": png_data_url(png)}}


def is_image_part(part: Mapping[str, Any]) -> bool:
    """Returns whether a content part is an image (`image_url` or `image`)."""
    return part.get("type") in ("image_url", "image")


def decode_image_part(part: Mapping[str, Any]) -> Image.Image:
    """Returns the (loaded) PIL image of an `image_url` data-URL part or an `image` bytes part.

    Raises ValueError naming what is wrong: a remote URL (never fetched: prompts must carry their
    pixels), a malformed data URL, a non-image media type, bad base64, or undecodable bytes.
    """
    kind = part.get("type")
    if kind == "image":
        data = part.get("image")
        if isinstance(data, Image.Image):
            return data
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise ValueError(f"image part needs 'image' as encoded image bytes, got {type(data).__name__}")
        return _open_image(bytes(data), "image part")
    if kind != "image_url":
        raise ValueError(f"content part of type {kind!r} is not an image part ('image_url' or 'image')")
    spec = part.get("image_url")
    url = spec.get("url") if isinstance(spec, Mapping) else spec
    if not isinstance(url, str):
        raise ValueError(f"image_url part needs image_url.url as a string, got {type(url).__name__}")
    if url.startswith(("http://", "https://", "file:", "ftp://")):
        raise ValueError(f"image_url {url[:80]!r} is a remote URL; only data URLs (data:image/...;base64,...) "
                         "are accepted: images are never fetched")
    if not url.startswith("data:"):
        raise ValueError(f"image_url {url[:40]!r}... is not a data URL; expected data:image/<type>;base64,<data>")
    header, sep, payload = url.partition(",")
    if not sep:
        raise ValueError(f"data URL {header[:60]!r} has no ',' before its data")
    fields = header[len("data:"):].split(";")
    media_type = fields[0].strip().lower()
    if not media_type.startswith("image/"):
        raise ValueError(f"data URL media type {media_type or '(none)'!r} is not an image type "
                         "(image/png, image/jpeg, ...)")
    if "base64" not in fields[1:]:
        raise ValueError(f"data URL {header!r} is not base64-encoded; expected data:{media_type};base64,<data>")
    try:
        data = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError) as err:
        raise ValueError(f"data URL ({media_type}) holds invalid base64 ({len(payload)} characters): {err}") from err
    return _open_image(data, f"data URL ({media_type})")


def _open_image(data: bytes, what: str) -> Image.Image:
    try:
        image = Image.open(io.BytesIO(data))
        image.load()
    except Exception as err:  # PIL raises several types for corrupt or non-image data
        raise ValueError(f"{what}: {len(data)} bytes are not a decodable image: {err}") from err
    return image


def render_chat(tokenizer, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True
                ) -> tuple[str, list[Image.Image]]:
    """Returns (prompt text from the tokenizer's chat template, the images in placeholder order).

    Image parts become HF's `{"type": "image"}` (one `<|image_pad|>` each in the text). Images are
    accepted only in user turns: Qwen's template drops non-text parts of system and assistant turns,
    which would silently lose pixels.
    """
    if not messages:
        raise ValueError("messages is empty; expected at least one chat message")
    converted, images = [], []
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise ValueError(f"messages[{i}] must be a dict with 'role' and 'content', got {type(message).__name__}")
        role, content = message.get("role"), message.get("content")
        if role not in ROLES:
            raise ValueError(f"messages[{i}].role is {role!r}; expected one of {list(ROLES)}")
        if isinstance(content, str):
            converted.append({"role": role, "content": content})
            continue
        if not isinstance(content, Sequence) or isinstance(content, (bytes, bytearray)):
            raise ValueError(f"messages[{i}].content must be a string or a list of parts, got {type(content).__name__}")
        parts = []
        for j, part in enumerate(content):
            where = f"messages[{i}].content[{j}]"
            if not isinstance(part, Mapping):
                raise ValueError(f"{where} must be a dict part, got {type(part).__name__}")
            if is_image_part(part):
                if role != "user":
                    raise ValueError(f"{where} is an image in a {role} turn; images are accepted only in user turns")
                try:
                    images.append(decode_image_part(part))
                except ValueError as err:
                    raise ValueError(f"{where}: {err}") from err
                parts.append({"type": "image"})
            elif part.get("type") == "text":
                text = part.get("text")
                if not isinstance(text, str):
                    raise ValueError(f"{where} is a text part whose 'text' is {type(text).__name__}, expected str")
                parts.append({"type": "text", "text": text})
            else:
                raise ValueError(f"{where} has type {part.get('type')!r}; expected 'text', 'image_url' or 'image'")
        converted.append({"role": role, "content": parts})
    text = tokenizer.apply_chat_template(converted, tokenize=False, add_generation_prompt=add_generation_prompt)
    if not isinstance(text, str):
        raise TypeError(f"the tokenizer's apply_chat_template returned {type(text).__name__}, expected str")
    if text.count(IMAGE_TOKEN) != len(images):
        raise ValueError(f"the chat template wrote {text.count(IMAGE_TOKEN)} {IMAGE_TOKEN} placeholder(s) for "
                         f"{len(images)} image(s); expected one per image")
    return text, images


def _encode_text(tokenizer, text: str, images: list[Image.Image], image_config: ImageProcessorConfig):
    """Returns (ids, token types, pixel values or None, grid or None) of rendered text with its images."""
    pixels, grid = preprocess_images(images, image_config) if images else (None, None)
    ids, types = encode_multimodal(tokenizer, text, grid, merge_size=image_config.merge_size)
    return ids, types, pixels, grid


def encode_chat(tokenizer, messages: Sequence[Mapping[str, Any]], image_config: ImageProcessorConfig | None = None,
                *, add_generation_prompt: bool = True) -> EncodedChat:
    """Returns the conversation tokenized for sampling (images preprocessed, placeholders expanded)."""
    image_config = image_config or ImageProcessorConfig()
    text, images = render_chat(tokenizer, messages, add_generation_prompt)
    ids, types, pixels, grid = _encode_text(tokenizer, text, images, image_config)
    return EncodedChat(ids, types, pixels, grid, None, len(ids))


def encode_for_training(tokenizer, messages: Sequence[Mapping[str, Any]], target_text: str,
                        image_config: ImageProcessorConfig | None = None, *,
                        mask: str = "thought_and_action", more_turns: Sequence[tuple[str, str]] = ()) -> EncodedChat:
    """Returns prompt + assistant `target_text` tokenized as the template renders it, with a loss mask.

    `input_ids` are exactly the tokens of the template's rendering of messages + the assistant turn;
    the first `prompt_length` of them equal `encode_chat(messages).input_ids`. `loss_mask` is 1 on
    the target's tokens and the closing `<|im_end|>` ("thought_and_action"), or only on the
    `<tool_call>...</tool_call>` tokens and `<|im_end|>` ("action_only"); 0 elsewhere.

    `more_turns`: (user text, assistant target) pairs that follow, each target masked as the first (several
    questions about one prompt in one row: the prompt is read once for all of them). Images stay in `messages`.
    """
    if mask not in MASK_MODES:
        raise ValueError(f"mask={mask!r}; expected one of {list(MASK_MODES)}")
    if messages and messages[-1].get("role") == "assistant":
        raise ValueError("messages end with an assistant turn; pass the prompt only and the assistant text "
                         "as target_text")
    image_config = image_config or ImageProcessorConfig()
    conversation, targets, starts, first_images = list(messages), [], [], None
    for k, (user_text, target) in enumerate([(None, target_text), *more_turns]):
        if not isinstance(target, str) or not target.strip():
            raise ValueError(f"target_text must be a non-empty string, got {target!r}" if not k else
                             f"more_turns[{k - 1}]: the target must be a non-empty string, got {target!r}")
        if END_OF_TURN in target:
            raise ValueError(f"target_text contains {END_OF_TURN!r}; the template closes the turn itself")
        if user_text is not None:
            conversation.append({"role": "user", "content": user_text})
        prompt_text, images = render_chat(tokenizer, conversation, add_generation_prompt=True)
        first_images = len(images) if first_images is None else first_images
        conversation.append({"role": "assistant", "content": target})
        targets.append(target)
        starts.append(prompt_text)
    full_text, _ = render_chat(tokenizer, conversation, add_generation_prompt=False)
    for prompt_text, target in zip(starts, targets):
        if not full_text.startswith(prompt_text) or not full_text[len(prompt_text):].startswith(target + END_OF_TURN):
            raise ValueError("the chat template does not render the assistant turn as generation prompt + target + "
                             f"{END_OF_TURN}; got the turn {full_text[len(prompt_text) - 20:][:120]!r}")
    if first_images != len(images):
        raise ValueError("more_turns hold images; images are accepted in the first prompt only")
    ids, types, pixels, grid = _encode_text(tokenizer, full_text, images, image_config)
    # Character offsets of the unexpanded tokens locate the targets' spans; image expansion only
    # happens inside the first prompt, so the tokens after it keep their index shift.
    encoding = tokenizer(full_text, add_special_tokens=False, return_offsets_mapping=True)
    offsets = np.asarray(encoding["offset_mapping"], dtype=np.int64).reshape(-1, 2)
    shift = len(ids) - len(offsets)
    loss_mask = np.zeros(len(ids), np.int32)
    end_id = tokenizer.convert_tokens_to_ids(END_OF_TURN)
    n = 0
    for prompt_text, target in zip(starts, targets):
        prompt_ids = encode_multimodal(tokenizer, prompt_text, grid, merge_size=image_config.merge_size)[0]
        at = len(prompt_ids)
        n = n or at
        if len(ids) <= at or not np.array_equal(ids[:at], prompt_ids):
            raise ValueError(f"target_text {target[:60]!r} merges with the end of the prompt when tokenized; "
                             "training and sampling would see different prefixes")
        start = len(prompt_text)
        if mask == "thought_and_action":
            lo, hi = start, start + len(target)
        else:
            open_at = target.find(TOOL_OPEN)
            close_at = target.find(TOOL_CLOSE, open_at + 1)
            if open_at < 0 or close_at < 0:
                raise ValueError(f"mask='action_only' needs a {TOOL_OPEN}...{TOOL_CLOSE} span in target_text, "
                                 f"got {target[:120]!r}")
            lo, hi = start + open_at, start + close_at + len(TOOL_CLOSE)
        end_at = start + len(target)  # where <|im_end|> starts
        for j, (a, b) in enumerate(offsets):
            if start <= a <= end_at and ((a < hi and b > lo) or a == end_at):
                loss_mask[j + shift] = 1
        end_index = at + int(np.argmax(ids[at:] == end_id))
        if ids[end_index] != end_id or loss_mask[end_index] != 1:
            raise ValueError(f"could not locate the closing {END_OF_TURN} of the assistant turn in the tokenized text")
    return EncodedChat(ids, types, pixels, grid, loss_mask, n)


def action_token_span(input_ids, prompt_length: int, tokenizer) -> tuple[int, int]:
    """Returns [lo, hi): the token range from the assistant turn's first `<tool_call>` through the
    `</tool_call>` after it, found by the markers' token ids at or after `prompt_length`.

    Both markers are single added tokens in Qwen's tokenizers (and the tiny one), so the span is
    exact whatever the tokenizer does with the JSON between them. Raises ValueError when the
    tokenizer lacks them or the turn holds no complete tool call.
    """
    marker_ids = []
    for marker in (TOOL_OPEN, TOOL_CLOSE):
        token_id = tokenizer.convert_tokens_to_ids(marker)
        if token_id is None or tokenizer.convert_ids_to_tokens(int(token_id)) != marker:
            raise ValueError(f"the tokenizer has no single token for {marker!r} (got id {token_id}); "
                             "action_token_span needs Qwen-style tool-call tokens")
        marker_ids.append(int(token_id))
    ids = np.asarray(input_ids).reshape(-1)
    if not 0 <= prompt_length <= len(ids):
        raise ValueError(f"prompt_length {prompt_length} is outside the {len(ids)} tokens of input_ids")
    opens = np.flatnonzero(ids[prompt_length:] == marker_ids[0])
    if not len(opens):
        raise ValueError(f"no {TOOL_OPEN} token (id {marker_ids[0]}) in the {len(ids) - prompt_length} tokens after "
                         f"the prompt's {prompt_length}: the assistant turn holds no tool call")
    lo = prompt_length + int(opens[0])
    closes = np.flatnonzero(ids[lo + 1:] == marker_ids[1])
    if not len(closes):
        raise ValueError(f"the {TOOL_OPEN} at token {lo} is never closed by {TOOL_CLOSE} (id {marker_ids[1]})")
    return lo, lo + 2 + int(closes[0])
