"""Token ids for Qwen3-VL prompts: load the tokenizer, expand image placeholders, left-pad batches.

`encode_multimodal` gives the same `input_ids` / `mm_token_type_ids` as transformers'
`Qwen3VLProcessor` for image prompts (that processor cannot be built without torchvision).
"""
from __future__ import annotations

import json
import pathlib
from collections.abc import Sequence

import numpy as np

IMAGE_TOKEN = "<|image_pad|>"
VIDEO_TOKEN = "<|video_pad|>"
# Values of mm_token_type_ids, as transformers' processors and get_rope_index use them.
TEXT_TYPE, IMAGE_TYPE = 0, 1

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json")
# The classes Qwen3-VL checkpoints' tokenizer_config.json names (transformers 5 has one class for both).
_QWEN2_TOKENIZER_CLASSES = ("Qwen2Tokenizer", "Qwen2TokenizerFast")


def load_tokenizer(checkpoint_dir: str | pathlib.Path):
    """Returns the transformers tokenizer saved in a local checkpoint folder (never the hub)."""
    path = pathlib.Path(checkpoint_dir)
    if not path.is_dir():
        raise FileNotFoundError(f"tokenizer folder {str(path)!r} does not exist")
    if not any((path / name).is_file() for name in _TOKENIZER_FILES):
        raise FileNotFoundError(
            f"tokenizer folder {str(path)!r} holds none of {', '.join(_TOKENIZER_FILES)}: not a saved tokenizer"
        )
    if _tokenizer_class(path) in _QWEN2_TOKENIZER_CLASSES:
        # Qwen's own class, as AutoTokenizer would pick it, without AutoTokenizer's import: that pulls in
        # transformers' model configs and, through them, torch where it is installed (~3 CPU-seconds a process).
        from transformers.models.qwen2.tokenization_qwen2 import Qwen2Tokenizer
        return Qwen2Tokenizer.from_pretrained(str(path), local_files_only=True)
    from transformers import AutoTokenizer  # deferred: a heavy import; only callers that tokenize pay for it
    return AutoTokenizer.from_pretrained(str(path), local_files_only=True)


def _tokenizer_class(path: pathlib.Path) -> str | None:
    """Returns the tokenizer_class that path/tokenizer_config.json names (None when it names none or is absent)."""
    config = path / "tokenizer_config.json"
    if not config.is_file():
        return None
    try:
        return json.loads(config.read_text()).get("tokenizer_class")
    except (json.JSONDecodeError, AttributeError) as err:
        raise ValueError(f"{config}: not a JSON object ({err})") from err


def encode_multimodal(
    tokenizer,
    text: str,
    image_grid_thw: np.ndarray | Sequence[Sequence[int]] | None,
    merge_size: int = 2,
    image_token_id: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Returns (input_ids int32 [L], mm_token_type_ids int32 [L]) for a rendered prompt with images.

    Each `<|image_pad|>` in `text` (one per image, as the chat template writes them) becomes
    t*h*w // merge_size**2 image tokens for the matching row of `image_grid_thw`, in order.
    `mm_token_type_ids` is 1 at image tokens, 0 elsewhere. The text is tokenized without
    adding special tokens: a rendered chat prompt already holds all of them.
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be one rendered prompt (str), got {type(text).__name__}")
    if image_token_id is None:
        image_token_id = tokenizer.convert_tokens_to_ids(IMAGE_TOKEN)
        if image_token_id is None or image_token_id == tokenizer.unk_token_id:
            raise ValueError(f"tokenizer has no {IMAGE_TOKEN} token; pass image_token_id")
    image_token_id = int(image_token_id)
    grids = np.zeros((0, 3), np.int64) if image_grid_thw is None else np.asarray(image_grid_thw, dtype=np.int64)
    if grids.ndim != 2 or grids.shape[1] != 3:
        raise ValueError(f"image_grid_thw must be [num_images, 3] (t, h, w), got shape {grids.shape}")
    if np.any(grids < 1) or np.any(grids[:, 1:] % merge_size):
        raise ValueError(
            f"image_grid_thw rows must be positive with h, w multiples of merge_size={merge_size}, got {grids.tolist()}"
        )

    ids = np.asarray(tokenizer(text, add_special_tokens=False)["input_ids"], dtype=np.int64)
    placeholders = np.flatnonzero(ids == image_token_id)
    if len(placeholders) != len(grids):
        image_token = tokenizer.convert_ids_to_tokens(image_token_id)
        raise ValueError(
            f"text has {len(placeholders)} {image_token} placeholder(s) but image_grid_thw has {len(grids)} image(s); "
            "expected one placeholder per image"
        )
    video_token_id = tokenizer.convert_tokens_to_ids(VIDEO_TOKEN)
    if video_token_id is not None and video_token_id != tokenizer.unk_token_id and np.any(ids == video_token_id):
        raise ValueError(f"text contains {VIDEO_TOKEN}: videos are not supported, only images")

    # Expanding after tokenization equals transformers' expand-then-tokenize: the placeholder is
    # an added token, so the tokenizer never merges it with neighbouring text.
    repeats = np.ones(len(ids), dtype=np.int64)
    repeats[placeholders] = np.prod(grids, axis=1) // (merge_size * merge_size)
    input_ids = np.repeat(ids, repeats)
    token_types = np.where(input_ids == image_token_id, IMAGE_TYPE, TEXT_TYPE)
    return input_ids.astype(np.int32), token_types.astype(np.int32)


def batch_left_pad(
    sequences: Sequence[Sequence[int] | np.ndarray],
    pad_id: int,
    length: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Returns (ids int32 [B, L], attention_mask int32 [B, L]) with every sequence right-aligned.

    Left padding keeps each prompt's last token in the final column, where generation continues.
    L is the longest sequence, or `length` when given (a fixed bucket size for jit).
    """
    if len(sequences) == 0:
        raise ValueError("batch_left_pad needs at least one sequence, got none")
    rows = [np.asarray(seq, dtype=np.int64).reshape(-1) for seq in sequences]
    longest = max(len(row) for row in rows)
    width = longest if length is None else int(length)
    if width < longest:
        raise ValueError(f"length={length} is shorter than the longest sequence ({longest} tokens)")
    ids = np.full((len(rows), width), pad_id, dtype=np.int32)
    mask = np.zeros((len(rows), width), dtype=np.int32)
    for i, row in enumerate(rows):
        if len(row):
            ids[i, width - len(row):] = row
            mask[i, width - len(row):] = 1
    return ids, mask
