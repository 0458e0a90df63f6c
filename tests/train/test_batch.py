"""The batch contract: validation names the bad key, position ids match the model's, packing is exact."""
import jax
import numpy as np
import pytest

from rmsweb_jax.models.qwen3_vl import create, prepare_inputs, tiny
from rmsweb_jax.train import batch as batch_lib
from rmsweb_jax.train.loss import make_sft_loss
from rmsweb_jax.train.step import ModelParts
from tests.train.batches import image_text_batch

CFG = tiny()


def _text_batch():
    ids = np.arange(40, 40 + 24, dtype=np.int32).reshape(2, 12)
    seg = np.ones((2, 12), np.int32)
    seg[1, 9:] = 0
    mask = np.zeros((2, 12), np.float32)
    mask[:, 5:9] = 1
    return {"input_ids": ids, "segment_ids": seg, "loss_mask": mask}


@pytest.mark.parametrize("edit, message", [
    (lambda b: b["loss_mask"].__setitem__((0, 0), 1.0), r"batch\['loss_mask'\]\[0, 0\] = 1.0 marks a token nothing "
                                                        r"predicts"),
    (lambda b: b["loss_mask"].__setitem__((1, 10), 1.0), r"batch\['loss_mask'\]\[1, 10\]"),
    (lambda b: b["segment_ids"].__setitem__((0, slice(6, 12)), 2), r"batch\['loss_mask'\]\[0, 6\]"),
    (lambda b: b.pop("loss_mask"), r"batch has no 'loss_mask'"),
    (lambda b: b.pop("segment_ids"), r"batch needs 'segment_ids' \(or 'attention_mask'\)"),
    (lambda b: b.__setitem__("loss_mask", b["loss_mask"][:, :5]), r"batch\['loss_mask'\] has shape \(2, 5\); "
                                                                   r"expected input_ids' shape \(2, 12\)"),
    (lambda b: b["input_ids"].__setitem__((1, 11), 512), r"token id 512, outside the model's vocabulary \[0, 512\)"),
    (lambda b: b["input_ids"].__setitem__((0, 3), CFG.image_token_id), r"holds image tokens \(id 5\) but the batch "
                                                                        r"has no pixel_values"),
    (lambda b: b.__setitem__("advantages", np.zeros(3)), r"batch\['advantages'\] has shape \(3,\); extra keys must "
                                                         r"lead with the batch's 2 rows"),
])
def test_bad_batches_are_named(edit, message):
    b = _text_batch()
    edit(b)
    with pytest.raises(ValueError, match=message):
        batch_lib.prepare_batch(b, CFG, 1)


def test_wrong_row_count_and_image_mismatch_are_named():
    with pytest.raises(ValueError, match=r"has 2 rows; this process expects 4"):
        batch_lib.prepare_batch(_text_batch(), CFG, 1, rows=4)
    b = image_text_batch(CFG)
    b["image_grid_thw"] = b["image_grid_thw"][[1, 0, 2, 3]]  # the first row's image is now the wide one
    with pytest.raises(ValueError, match=r"batch row 0 holds 4 image tokens but image_grid_thw .* gives its images 8"):
        batch_lib.prepare_batch(b, CFG, 1)


def test_attention_mask_is_accepted_and_extras_ride_along():
    b = _text_batch()
    b["attention_mask"] = b.pop("segment_ids")
    b["advantages"] = np.array([0.5, -1.0], np.float32)
    tb = batch_lib.prepare_batch(b, CFG, 2)
    assert tb.inputs.segment_ids.shape == (2, 1, 12)
    np.testing.assert_array_equal(tb.extras["advantages"][:, 0], [0.5, -1.0])


def test_position_ids_match_prepare_inputs_and_restart_per_packed_sequence():
    b = image_text_batch(CFG)
    tb = batch_lib.prepare_batch(b, CFG, 1)
    want = prepare_inputs(CFG, b["input_ids"], attention_mask=b["segment_ids"], pixel_values=b["pixel_values"][:80],
                          image_grid_thw=b["image_grid_thw"])
    np.testing.assert_array_equal(tb.inputs.position_ids[0], want.position_ids)
    np.testing.assert_array_equal(tb.inputs.vision.pixel_values[0, :80], want.vision.pixel_values)
    assert tb.inputs.vision.pixel_values.shape[1] == 96 and not tb.inputs.vision.segment_ids[0, 80:].any()
    # Pack row 0 (20 tokens, one image) behind row 1 (12 tokens, text): row 0's positions restart at 0.
    packed_ids = np.zeros((1, 32), np.int32)
    packed_ids[0, :12], packed_ids[0, 12:] = b["input_ids"][1, :12], b["input_ids"][0, :20]
    seg = np.array([[1] * 12 + [2] * 20], np.int32)
    mask = np.zeros((1, 32), np.float32)
    mask[0, 12 + 12:] = 1
    packed = batch_lib.prepare_batch({"input_ids": packed_ids, "segment_ids": seg, "loss_mask": mask,
                                      "pixel_values": b["pixel_values"][:16],
                                      "image_grid_thw": b["image_grid_thw"][:1]}, CFG, 1)
    np.testing.assert_array_equal(packed.inputs.position_ids[0, :, 0, 12:], want.position_ids[:, 0, :20])
    np.testing.assert_array_equal(packed.inputs.position_ids[0, :, 0, :12], want.position_ids[:, 1, :12])


def test_microbatches_interleave_rows():
    b = image_text_batch(CFG)
    tb = batch_lib.prepare_batch(b, CFG, 2)
    np.testing.assert_array_equal(tb.inputs.input_ids[0], b["input_ids"][[0, 2]])
    np.testing.assert_array_equal(tb.inputs.input_ids[1], b["input_ids"][[1, 3]])
    counts = batch_lib.batch_counts(tb)
    assert counts == {"tokens": 78, "target_tokens": 24, "patches": 80, "images": 4}


def test_a_packed_row_has_the_loss_of_its_sequences_apart():
    parts = ModelParts.split(create(CFG, seed=4))
    loss_fn = make_sft_loss()

    @jax.jit
    def loss_parts(batch):
        out, _ = loss_fn(parts.merge(), jax.tree.map(lambda x: x[0], batch))
        return out

    rng = np.random.default_rng(0)
    a, c = rng.integers(10, 500, 14).astype(np.int32), rng.integers(10, 500, 10).astype(np.int32)
    apart = {"input_ids": np.zeros((2, 24), np.int32), "segment_ids": np.zeros((2, 24), np.int32),
             "loss_mask": np.zeros((2, 24), np.float32)}
    apart["input_ids"][0, :14], apart["input_ids"][1, :10] = a, c
    apart["segment_ids"][0, :14], apart["segment_ids"][1, :10] = 1, 1
    apart["loss_mask"][0, 6:14], apart["loss_mask"][1, 3:10] = 1, 1
    packed = {"input_ids": np.zeros((2, 24), np.int32), "segment_ids": np.zeros((2, 24), np.int32),
              "loss_mask": np.zeros((2, 24), np.float32)}
    packed["input_ids"][0] = np.concatenate([a, c])
    packed["segment_ids"][0] = [1] * 14 + [2] * 10
    packed["loss_mask"][0, 6:14], packed["loss_mask"][0, 14 + 3:24] = 1, 1
    want = loss_parts(jax.tree.map(np.asarray, batch_lib.prepare_batch(apart, CFG, 1)))
    got = loss_parts(jax.tree.map(np.asarray, batch_lib.prepare_batch(packed, CFG, 1)))
    assert float(got.denominator) == float(want.denominator) == 15
    assert abs(float(got.sum) - float(want.sum)) <= 1e-4, (float(got.sum), float(want.sum))
    # Without segment ids the second sequence would attend to the first: a different loss.
    joined = dict(packed, segment_ids=(packed["segment_ids"] > 0).astype(np.int32))
    joined["loss_mask"] = packed["loss_mask"].copy()
    other = loss_parts(jax.tree.map(np.asarray, batch_lib.prepare_batch(joined, CFG, 1)))
    assert abs(float(other.sum) - float(want.sum)) > 1e-2
