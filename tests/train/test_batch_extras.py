"""Per-token (token_*) and per-row batch extras: shifted with the targets, split into microbatches, validated,
and carried by the bucket batcher (data/batching.py) from encoded examples."""
import numpy as np
import pytest

from rmsweb_jax.data.batching import assemble
from rmsweb_jax.models.qwen3_vl import tiny
from rmsweb_jax.train import batch as batch_lib

CFG = tiny()


def _batch(rows=4, length=10):
    ids = (np.arange(rows * length).reshape(rows, length) % 300 + 7).astype(np.int32)
    mask = np.zeros((rows, length), np.float32)
    mask[:, 4:] = 1
    return {"input_ids": ids, "segment_ids": np.ones((rows, length), np.int32), "loss_mask": mask,
            "token_old_logprobs": -np.arange(rows * length, dtype=np.float32).reshape(rows, length) / 10,
            "advantage": np.array([1.0, -1.0, 0.5, 0.0], np.float32)[:rows]}


@pytest.mark.parametrize("microbatches", [1, 2, 4])
def test_token_extras_shift_with_the_targets_across_microbatches(microbatches):
    host = _batch()
    tb = batch_lib.prepare_batch(host, CFG, microbatches)
    token, adv = tb.extras["token_old_logprobs"], tb.extras["advantage"]
    assert token.shape == (microbatches, 4 // microbatches, 10)
    for m in range(microbatches):
        rows = np.arange(m, 4, microbatches)
        # Position t predicts token t + 1: its field value is the target's, exactly like weights.
        np.testing.assert_array_equal(token[m, :, :-1], host["token_old_logprobs"][rows, 1:])
        assert not token[m, :, -1].any()
        np.testing.assert_array_equal(tb.weights[m, :, :-1], host["loss_mask"][rows, 1:])
        np.testing.assert_array_equal(tb.targets[m, :, :-1], host["input_ids"][rows, 1:])
        np.testing.assert_array_equal(adv[m], host["advantage"][rows])  # per-row: not shifted
    # rows_of + unshift_tokens give the contract layout back (position 0, which nothing predicts, is 0).
    back = batch_lib.unshift_tokens(batch_lib.rows_of(token, microbatches))
    np.testing.assert_array_equal(back[:, 1:], host["token_old_logprobs"][:, 1:])
    assert not back[:, 0].any()


@pytest.mark.parametrize("edit, message", [
    (lambda b: b.__setitem__("token_old_logprobs", b["token_old_logprobs"][:, :-1]),
     r"batch\['token_old_logprobs'\] has shape \(4, 9\); a per-token field \(token_\*\) must have input_ids' shape "
     r"\(4, 10\)"),
    (lambda b: b["token_old_logprobs"].__setitem__((2, 7), np.nan),
     r"batch\['token_old_logprobs'\]\[2, 7\] = nan is not finite \(1 such values\)"),
    (lambda b: b["token_old_logprobs"].__setitem__((0, 0), -np.inf), r"\[0, 0\] = -inf is not finite"),
    (lambda b: b.__setitem__("token_names", np.full((4, 10), "x")), r"batch\['token_names'\] has dtype <U1"),
])
def test_bad_token_extras_are_named(edit, message):
    b = _batch()
    edit(b)
    with pytest.raises(ValueError, match=message):
        batch_lib.prepare_batch(b, CFG, 1)


def _example(n, first, adv, name):
    ids = np.arange(first, first + n, dtype=np.int32)
    mask = np.zeros(n, np.float32)
    mask[n // 2:] = 1
    return {"input_ids": ids, "loss_mask": mask, "pixel_values": np.zeros((0, 8), np.float32),
            "image_grid_thw": np.zeros((0, 3), np.int64), "name": name,
            "token_old_logprobs": -ids.astype(np.float32), "advantage": np.float32(adv), "anchor": np.float32(0)}


def test_bucket_batches_carry_token_and_row_fields_with_zero_padding():
    examples = [_example(5, 10, 1.0, "a"), _example(7, 20, -1.0, "b")]
    batch = assemble([[examples[0]], [examples[1]], []], length=8, patch_rows=0, patch_dim=8)
    np.testing.assert_array_equal(batch["token_old_logprobs"][0], [-10, -11, -12, -13, -14, 0, 0, 0])
    np.testing.assert_array_equal(batch["token_old_logprobs"][1], [-20, -21, -22, -23, -24, -25, -26, 0])
    assert not batch["token_old_logprobs"][2].any()
    np.testing.assert_array_equal(batch["advantage"], [1.0, -1.0, 0.0])
    np.testing.assert_array_equal(batch["anchor"], [0.0, 0.0, 0.0])
    tb = batch_lib.prepare_batch(batch, CFG, 1)  # the batch meets the trainer's contract
    np.testing.assert_array_equal(tb.extras["token_old_logprobs"][0, 0, :4], [-11, -12, -13, -14])
    # Packed rows: token fields follow their sequences; a per-row field has no single value per row.
    with pytest.raises(ValueError, match=r"per-row field 'advantage' cannot go into packed rows"):
        assemble([[examples[0], _example(3, 40, 0.5, "c")]], length=8, patch_rows=0, patch_dim=8)
    missing = _example(4, 50, 0.0, "d")
    del missing["anchor"]
    with pytest.raises(ValueError, match=r"example d has optional fields \['advantage', 'token_old_logprobs'\]; "
                                         r"the batch's first example a has"):
        assemble([[examples[0]], [missing]], length=8, patch_rows=0, patch_dim=8)
    short = dict(_example(4, 60, 0.0, "e"), token_old_logprobs=np.zeros(3, np.float32))
    with pytest.raises(ValueError, match=r"example e: 'token_old_logprobs' has shape \(3,\); a per-token field must "
                                         r"have one value per token \(4,\)"):
        assemble([[short]], length=8, patch_rows=0, patch_dim=8)
