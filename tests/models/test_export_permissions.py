"""to_hf writes the checkpoint with the umask's permissions, so a serving container or a colleague can read it."""
import os
import stat

import pytest

from rmsweb_jax.models import qwen3_vl


@pytest.fixture(scope="module")
def model():
    return qwen3_vl.create(qwen3_vl.tiny())


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.mark.parametrize("umask, shard_bytes", [(0o022, 5 * 2 ** 30), (0o027, 200_000)])
def test_exported_checkpoint_follows_the_umask(model, tmp_path, umask, shard_bytes):
    tokenizer = tmp_path / "tokenizer"
    tokenizer.mkdir()
    (tokenizer / "tokenizer_config.json").write_text("{}")
    (tokenizer / "tokenizer_config.json").chmod(0o600)  # copied files do not keep a private mode
    old = os.umask(umask)
    try:
        out = qwen3_vl.to_hf(model, tmp_path / "export", tokenizer_dir=tokenizer, max_shard_bytes=shard_bytes)
    finally:
        os.umask(old)
    files = sorted(p.name for p in out.iterdir())
    assert "config.json" in files and "tokenizer_config.json" in files
    assert ("model.safetensors.index.json" in files) == (shard_bytes < 2 ** 20)
    assert oct(_mode(out)) == oct(0o777 & ~umask)
    assert {f: oct(_mode(out / f)) for f in files} == {f: oct(0o666 & ~umask) for f in files}
