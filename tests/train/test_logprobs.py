"""Forward-only token log-probs (train/logprobs.py) against log_softmax of the model's own logits."""
import numpy as np
import pytest

from rmsweb_jax.models import qwen3_vl, sharding
from rmsweb_jax.train import batch as batch_lib
from rmsweb_jax.train.logprobs import sequence_logprobs, token_logprobs_of
from rmsweb_jax.train.step import ModelParts
from tests.train.batches import image_text_batch


@pytest.fixture(scope="module")
def model(tiny_checkpoint):
    return qwen3_vl.from_hf(tiny_checkpoint)


def _expected(model, host):
    """Returns [b, L] log_softmax(logits)[t, input_ids[t + 1]] from the model's full logits, row by row."""
    out = np.zeros(host["input_ids"].shape, np.float64)
    patch = 0
    per_row = [[(1, 4, 4)], [], [(1, 4, 8)], [(1, 4, 4), (1, 4, 4)]]  # image_text_batch's rows
    for r, row_grids in enumerate(per_row):
        n = int(host["segment_ids"][r].sum())
        ids = host["input_ids"][r:r + 1, :n]
        count = sum(int(np.prod(g)) for g in row_grids)
        kw = {}
        if row_grids:
            kw = dict(pixel_values=host["pixel_values"][patch:patch + count], image_grid_thw=np.array(row_grids))
        patch += count
        logits = np.asarray(model(ids, attention_mask=np.ones_like(ids), **kw).logits[0], np.float64)
        top = logits.max(-1, keepdims=True)
        logp = logits - top - np.log(np.exp(logits - top).sum(-1, keepdims=True))
        out[r, :n - 1] = logp[np.arange(n - 1), ids[0, 1:]]
    return out


@pytest.mark.parametrize("impl", ["chunked", "reference", "fused"])
def test_token_logprobs_equal_log_softmax_of_the_logits(model, impl):
    host = image_text_batch(model.config, seed=3)
    tb = batch_lib.prepare_batch(host, model.config, 2)
    got = np.asarray(token_logprobs_of(ModelParts.split(model), tb, impl=impl))
    # Back from microbatch order to row order (prepare_batch: microbatch m holds rows m, m + M, ...).
    rows = np.zeros((4, got.shape[-1]))
    weights = np.zeros_like(rows)
    for m in range(2):
        rows[m::2] = got[m]
        weights[m::2] = np.asarray(tb.weights[m])
    want = _expected(model, host) * (weights != 0)
    np.testing.assert_allclose(rows, want, atol=2e-5)
    assert np.all(rows[weights == 0] == 0) and np.all(rows[weights != 0] < 0)
    seq = np.asarray(sequence_logprobs(got, tb.weights))  # [M, b]: log p(target span | prefix) per row
    np.testing.assert_allclose(seq[0], want[0::2].sum(-1), rtol=1e-5)
    np.testing.assert_allclose(seq[1], want[1::2].sum(-1), rtol=1e-5)


def test_on_a_mesh_the_log_probs_equal_one_device(model, tiny_checkpoint):
    host = image_text_batch(model.config, seed=4)
    tb = batch_lib.prepare_batch(host, model.config, 1)
    single = np.asarray(token_logprobs_of(ModelParts.split(model), tb))
    mesh = sharding.make_mesh((2, 2, 2))
    sharded = qwen3_vl.from_hf(tiny_checkpoint, mesh=mesh)
    placed = batch_lib.to_global(tb, batch_lib.batch_shardings(tb, mesh))
    got = np.asarray(token_logprobs_of(ModelParts.split(sharded), placed, impl="chunked"))
    np.testing.assert_allclose(got, single, atol=1e-5)
