"""Parity of our Qwen3-VL with transformers' torch implementation on tiny random checkpoints (fp32)."""
import json

import numpy as np
import pytest
import torch
from transformers import Qwen3VLForConditionalGeneration

from rmsweb_jax.models.qwen3_vl import params
from tests.models import hf_reference as ref

TOL = 1e-4


def _max_diff(a, b, mask):
    return float(np.abs(a - b)[mask.astype(bool)].max())


@pytest.fixture(scope="module")
def default_ckpt(tmp_path_factory):
    d = tmp_path_factory.mktemp("qwen3vl_default")
    return d, ref.write_checkpoint(d, seed=0)


def test_text_only_batch_with_left_padding(default_ckpt):
    d, torch_model = default_ckpt
    model = params.from_hf(d)
    rng = np.random.default_rng(1)
    ids, mask = ref.left_pad([list(rng.integers(10, ref.VOCAB, n)) for n in (5, 13, 9)])
    expected = ref.torch_logits(torch_model, ids, mask)
    got = np.asarray(model(ids, attention_mask=mask).logits)
    assert got.shape == expected.shape
    assert _max_diff(got, expected, mask) <= TOL


def test_two_images_of_different_sizes_with_deepstack(default_ckpt):
    d, torch_model = default_ckpt
    model = params.from_hf(d)
    assert model.config.vision.deepstack_visual_indexes == (0, 1)
    rng = np.random.default_rng(2)
    grids = [[1, 4, 6], [1, 8, 4]]
    rows, pixels = ref.image_prompt(rng, grids)
    ids, mask = ref.left_pad(rows)
    expected = ref.torch_logits(torch_model, ids, mask, pixels, grids)
    got = np.asarray(model(ids, attention_mask=mask, pixel_values=pixels, image_grid_thw=np.array(grids)).logits)
    assert _max_diff(got, expected, mask) <= TOL


def test_two_images_in_one_row_and_deepstack_changes_output(tmp_path):
    torch_model = ref.write_checkpoint(tmp_path, seed=3, deepstack=(0, 2))
    model = params.from_hf(tmp_path)
    rng = np.random.default_rng(3)
    grids = [[1, 4, 4], [1, 6, 4]]
    rows, pixels = ref.image_prompt(rng, grids)
    ids, mask = ref.left_pad([rows[0] + rows[1]])
    expected = ref.torch_logits(torch_model, ids, mask, pixels, grids)
    got = np.asarray(model(ids, attention_mask=mask, pixel_values=pixels, image_grid_thw=np.array(grids)).logits)
    assert _max_diff(got, expected, mask) <= TOL
    # The DeepStack path is live: zeroing a deepstack merger's output weights changes the logits.
    model.visual.deepstack_mergers.fc2_kernel[...] = 0 * model.visual.deepstack_mergers.fc2_kernel[...]
    model.visual.deepstack_mergers.fc2_bias[...] = 0 * model.visual.deepstack_mergers.fc2_bias[...]
    changed = np.asarray(model(ids, attention_mask=mask, pixel_values=pixels, image_grid_thw=np.array(grids)).logits)
    assert _max_diff(changed, expected, mask) > 1e-3


def test_tied_embeddings(tmp_path):
    torch_model = ref.write_checkpoint(tmp_path, seed=4, tie_word_embeddings=True)
    model = params.from_hf(tmp_path)
    assert model.config.tie_word_embeddings and model.text.lm_head is None
    rng = np.random.default_rng(4)
    grids = [[1, 4, 4]]
    rows, pixels = ref.image_prompt(rng, grids)
    ids, mask = ref.left_pad(rows)
    expected = ref.torch_logits(torch_model, ids, mask, pixels, grids)
    got = np.asarray(model(ids, attention_mask=mask, pixel_values=pixels, image_grid_thw=np.array(grids)).logits)
    assert _max_diff(got, expected, mask) <= TOL


def test_head_dim_times_heads_differs_from_hidden_and_published_rope_form(tmp_path):
    # As in the 32B model: heads * head_dim (4 * 32 = 128) != hidden (64); config in rope_theta + rope_scaling form.
    torch_model = ref.write_checkpoint(tmp_path, seed=5, head_dim=32, rope_form="rope_scaling")
    raw = json.loads((tmp_path / "config.json").read_text())
    model = params.from_hf(tmp_path)
    assert model.config.text.head_dim * model.config.text.num_attention_heads != model.config.text.hidden_size
    assert raw["text_config"].get("rope_parameters") or raw["text_config"].get("rope_theta")
    rng = np.random.default_rng(5)
    grids = [[1, 4, 6], [1, 4, 4]]
    rows, pixels = ref.image_prompt(rng, grids)
    ids, mask = ref.left_pad(rows)
    expected = ref.torch_logits(torch_model, ids, mask, pixels, grids)
    got = np.asarray(model(ids, attention_mask=mask, pixel_values=pixels, image_grid_thw=np.array(grids)).logits)
    assert _max_diff(got, expected, mask) <= TOL


def test_round_trip_hf_to_ours_to_hf(default_ckpt, tmp_path):
    d, torch_model = default_ckpt
    model = params.from_hf(d)
    out = params.to_hf(model, tmp_path / "export", max_shard_bytes=200_000)  # force several shards + index
    assert (out / "model.safetensors.index.json").is_file()
    reloaded = Qwen3VLForConditionalGeneration.from_pretrained(out, dtype=torch.float32, attn_implementation="eager").eval()
    for (name, a), (name_b, b) in zip(sorted(torch_model.state_dict().items()),
                                      sorted(reloaded.state_dict().items())):
        assert name == name_b
        assert torch.equal(a, b), name
    rng = np.random.default_rng(6)
    grids = [[1, 4, 6]]
    rows, pixels = ref.image_prompt(rng, grids)
    ids, mask = ref.left_pad(rows)
    expected = ref.torch_logits(torch_model, ids, mask, pixels, grids)
    got = ref.torch_logits(reloaded, ids, mask, pixels, grids)
    np.testing.assert_array_equal(got, expected)
    # And our model reloaded from the export gives the same logits as before.
    again = params.from_hf(out)
    np.testing.assert_allclose(np.asarray(again(ids, attention_mask=mask, pixel_values=pixels,
                                                image_grid_thw=np.array(grids)).logits),
                               np.asarray(model(ids, attention_mask=mask, pixel_values=pixels,
                                                image_grid_thw=np.array(grids)).logits), atol=0, rtol=0)
