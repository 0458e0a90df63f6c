"""Inputs for Qwen3-VL: image preprocessing (smart_resize, patches) and prompt token ids."""
from rmsweb_jax.processing.image import (
    ImageProcessorConfig,
    num_image_tokens,
    preprocess_images,
    smart_resize,
    to_rgb_array,
)
from rmsweb_jax.processing.prompt_tokens import batch_left_pad, encode_multimodal, load_tokenizer

__all__ = [
    "ImageProcessorConfig",
    "batch_left_pad",
    "encode_multimodal",
    "load_tokenizer",
    "num_image_tokens",
    "preprocess_images",
    "smart_resize",
    "to_rgb_array",
]
