"""Session fixtures for the data tests: a synthetic store written through the real StoreWriter, the tiny
tokenizer, a small image config, and every SFT example encoded once (the reference the batches are
checked against)."""
import pytest

from configs.common import base_config
from rmsweb_jax.agents.prompt import prompt_config_from
from rmsweb_jax.collect.sft_view import SFTView
from configs.common import base_config
from rmsweb_jax.data.sft import EncodeSFTExample, example_name
from rmsweb_jax.collect.store_fixture import write_synthetic_store
from rmsweb_jax.processing.image import ImageProcessorConfig
from rmsweb_jax.processing.tiny_tokenizer import build_tiny_tokenizer

# 200x120 screenshots resize to 128x192 pixels: 96 patches, 24 image tokens per screenshot.
IMAGE_CONFIG = ImageProcessorConfig(min_pixels=8192, max_pixels=65536)
VIEWPORT = (200, 120)
PROMPT = prompt_config_from(base_config())  # the shipped prompt settings


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory):
    """Returns the folder of the tiny Qwen-style tokenizer."""
    folder = tmp_path_factory.mktemp("sft_tokenizer")
    build_tiny_tokenizer(folder)
    return folder


@pytest.fixture(scope="session")
def store_dir(tmp_path_factory):
    """Returns a store of 4 tasks x 2 seeds (3 successful steps each; every third group failed once first)."""
    return write_synthetic_store(tmp_path_factory.mktemp("sft_store") / "store", tasks=4, seeds=2, viewport=VIEWPORT)


@pytest.fixture(scope="session")
def view(store_dir):
    return SFTView(store_dir)


@pytest.fixture(scope="session")
def encoder(tokenizer_dir):
    return EncodeSFTExample(tokenizer_dir, IMAGE_CONFIG, PROMPT, mask=base_config().data.mask)


@pytest.fixture(scope="session")
def encoded(view, encoder):
    """Returns {example name: encoded example} for every example of the view."""
    out = {}
    for i in range(len(view)):
        ex = view[i]
        out[example_name(ex)] = encoder.map(ex)
    return out
