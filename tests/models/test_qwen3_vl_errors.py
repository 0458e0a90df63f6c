"""Bad checkpoints and bad inputs fail with errors that name the file, key, shape or value."""
import json

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from rmsweb_jax.models.qwen3_vl import Qwen3VLConfig, params, parameter_count, preset, tiny, create
from tests.models import hf_reference as ref


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    d = tmp_path_factory.mktemp("qwen3vl_err")
    ref.write_checkpoint(d, seed=21)
    return d


def _copy(src, dst):
    dst.mkdir()
    for f in src.iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    return dst


def test_published_parameter_counts_from_abstract_shapes():
    assert parameter_count(preset("8b")) == 8_767_123_696
    assert parameter_count(preset("32b")) == 33_357_390_064


def test_unknown_model_type(ckpt, tmp_path):
    d = _copy(ckpt, tmp_path / "c")
    cfg = json.loads((d / "config.json").read_text())
    cfg["model_type"] = "llava"
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=r"config.json: unknown model_type 'llava'"):
        params.from_hf(d)


def test_missing_shard_file_is_named(ckpt, tmp_path):
    d = tmp_path / "sharded"
    params.to_hf(params.from_hf(ckpt), d, max_shard_bytes=200_000)
    victim = sorted(d.glob("model-*.safetensors"))[1]
    victim.unlink()
    with pytest.raises(FileNotFoundError, match=victim.name):
        params.from_hf(d)


def test_tensor_shape_mismatch_names_key_and_shapes(ckpt, tmp_path):
    d = _copy(ckpt, tmp_path / "c")
    tensors = load_file(d / "model.safetensors")
    key = "model.language_model.layers.1.mlp.up_proj.weight"
    good = tensors[key].shape
    tensors[key] = np.zeros((good[0] + 1, good[1]), tensors[key].dtype)
    save_file(tensors, d / "model.safetensors")
    with pytest.raises(ValueError) as e:
        params.from_hf(d)
    msg = str(e.value)
    assert key in msg and str((good[0] + 1, good[1])) in msg and str(good) in msg


def test_missing_tensor_is_named(ckpt, tmp_path):
    d = _copy(ckpt, tmp_path / "c")
    tensors = load_file(d / "model.safetensors")
    del tensors["model.visual.pos_embed.weight"]
    save_file(tensors, d / "model.safetensors")
    with pytest.raises(KeyError, match="model.visual.pos_embed.weight"):
        params.from_hf(d)


def test_missing_config_and_bad_json(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        params.from_hf(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        params.from_hf(tmp_path)


def test_config_validation_names_the_key():
    d = tiny().to_hf_dict()
    d["text_config"]["num_key_value_heads"] = 3
    with pytest.raises(ValueError, match="text_config.num_key_value_heads"):
        Qwen3VLConfig.from_hf_dict(d)


def test_image_tokens_must_match_the_grid():
    model = create(tiny())
    ids = np.array([[1, 3] + [5] * 5 + [4]])
    with pytest.raises(ValueError, match=r"5 image tokens but image_grid_thw \[\[1, 4, 4\]\] needs 4"):
        model(ids, pixel_values=np.zeros((16, 1536), np.float32), image_grid_thw=np.array([[1, 4, 4]]))
    with pytest.raises(ValueError, match=r"pixel_values shape \(15, 1536\)"):
        model(ids, pixel_values=np.zeros((15, 1536), np.float32), image_grid_thw=np.array([[1, 4, 4]]))


def test_config_round_trips_through_hf_dict():
    for name in ("8b", "32b", "tiny"):
        cfg = preset(name)
        assert Qwen3VLConfig.from_hf_dict(cfg.to_hf_dict()) == cfg
