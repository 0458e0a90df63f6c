"""Session fixtures for the processing tests: the tiny tokenizer and transformers' Qwen3-VL processor."""
import pytest
from transformers import AutoTokenizer

from rmsweb_jax.processing.tiny_tokenizer import build_tiny_tokenizer

from .hf_reference import ImageOnlyQwen3VLProcessor, hf_image_processor


@pytest.fixture(scope="session")
def tiny_tokenizer(tmp_path_factory):
    """Returns (folder, special-token ids) of the tiny Qwen-style tokenizer, built once per session."""
    folder = tmp_path_factory.mktemp("tiny_tokenizer")
    return folder, build_tiny_tokenizer(folder)


@pytest.fixture(scope="session")
def hf_tokenizer(tiny_tokenizer):
    """Returns the tiny tokenizer as transformers loads it."""
    return AutoTokenizer.from_pretrained(str(tiny_tokenizer[0]))


@pytest.fixture(scope="session")
def hf_processor(hf_tokenizer):
    """Returns transformers' Qwen3-VL processor over the tiny tokenizer and the Qwen3-VL image processor."""
    return ImageOnlyQwen3VLProcessor(image_processor=hf_image_processor(), tokenizer=hf_tokenizer)
