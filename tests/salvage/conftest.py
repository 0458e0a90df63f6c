"""Session fixtures for the Salvage-DS tests: the tiny tokenizer and a synthetic trajectory store
written through the real StoreWriter (the same shapes as tests/data)."""
import pytest

from configs.common import base_config
from rmsweb_jax.agents.prompt import prompt_config_from
from rmsweb_jax.collect.sft_view import SFTView
from rmsweb_jax.collect.store_fixture import write_synthetic_store
from rmsweb_jax.processing.image import ImageProcessorConfig
from rmsweb_jax.processing.tiny_tokenizer import build_tiny_tokenizer

IMAGE_CONFIG = ImageProcessorConfig(min_pixels=8192, max_pixels=65536)
VIEWPORT = (200, 120)
PROMPT = prompt_config_from(base_config())


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("salvage_tokenizer")
    build_tiny_tokenizer(folder)
    return folder


@pytest.fixture(scope="session")
def tokenizer(tokenizer_dir):
    from rmsweb_jax.processing.prompt_tokens import load_tokenizer
    return load_tokenizer(tokenizer_dir)


@pytest.fixture(scope="session")
def view(tmp_path_factory):
    store = write_synthetic_store(tmp_path_factory.mktemp("salvage_store") / "store", tasks=2, seeds=2,
                                  viewport=VIEWPORT)
    return SFTView(store)
