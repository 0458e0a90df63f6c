"""One random tiny checkpoint (with the tiny tokenizer) for every trainer test of the session."""
import pytest


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory):
    """Returns the directory of an HF-format random tiny Qwen3-VL (what 'random:tiny' writes)."""
    from configs.common import base_config

    from rmsweb_jax.model_init import load_model
    config = base_config()
    config.mesh.shape = (1, 1, 1)
    _, path = load_model(config, tmp_path_factory.mktemp("tiny_init"))
    return path
