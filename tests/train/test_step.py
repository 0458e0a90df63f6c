"""The jitted train step: exact gradient accumulation, the loss mask, and a (2,2,2) mesh equal to one device.

Parameter comparisons use clipped SGD, so a parameter difference is a gradient difference. AdamW's
first steps divide each gradient by |g| + eps, which turns float rounding (~1e-7) of near-zero
gradients into ~1e-5 parameter differences that say nothing about accumulation or sharding
(measured here: 22 of 334,512 elements); the AdamW path itself is exercised by tests/train/test_loop.py.
"""
import jax
import numpy as np
import optax
import pytest

from rmsweb_jax.models import sharding
from rmsweb_jax.models.qwen3_vl import create, tiny
from rmsweb_jax.train import batch as batch_lib
from rmsweb_jax.train.loss import make_sft_loss
from rmsweb_jax.train.step import (ModelParts, TrainStep, init_train_state, param_shardings,
                                   train_state_shardings)
from tests.train.batches import image_text_batch

CFG = tiny()
LR = 0.5


def _optimizer():
    return optax.chain(optax.clip_by_global_norm(1.0), optax.sgd(LR))


def _setup(mesh=None, microbatches=1):
    model = create(CFG, mesh=mesh, seed=0)
    parts = ModelParts.split(model)
    tx = _optimizer()
    p_sh = param_shardings(model, mesh)
    s_sh = train_state_shardings(parts.params, tx, mesh, p_sh)
    step = TrainStep(parts, make_sft_loss(), tx, mesh=mesh, p_shardings=p_sh, shardings=s_sh, donate=False)
    return parts, tx, s_sh, step


def _flat(params) -> np.ndarray:
    return np.concatenate([np.asarray(x).ravel() for x in jax.tree.leaves(params)])


@pytest.fixture(scope="module")
def single():
    parts, tx, _, step = _setup()
    return parts, tx, step


def _run(parts, tx, step, host, microbatches, steps=1, mesh=None, s_sh=None):
    state = init_train_state(parts.params, tx, 0, s_sh)
    tb = batch_lib.prepare_batch(host, CFG, microbatches)
    placed = batch_lib.to_global(tb, batch_lib.batch_shardings(tb, mesh))
    losses = []
    for _ in range(steps):
        state, metrics = step(state, placed)
        losses.append(float(metrics["loss"]))
    return state, losses, tb


def test_accumulation_two_microbatches_equal_one_batch(single):
    parts, tx, step = single
    host = image_text_batch(CFG)
    whole, loss_whole, tb1 = _run(parts, tx, step, host, microbatches=1)
    split, loss_split, tb2 = _run(parts, tx, step, host, microbatches=2)
    assert tb2.targets.shape[:2] == (2, 2) and tb1.targets.shape[:2] == (1, 4)
    counts = tb2.weights.sum(axis=(1, 2))
    assert counts[0] != counts[1], counts  # unequal token counts: a mean of means would differ
    assert tb2.inputs.vision.pixel_values.shape[1] == 48  # patches re-bucketed per microbatch
    assert abs(loss_whole[0] - loss_split[0]) <= 1e-6, (loss_whole, loss_split)
    np.testing.assert_allclose(_flat(whole.params), _flat(split.params), atol=1e-6, rtol=0)
    # The update is real: parameters moved by far more than the tolerance.
    assert np.abs(_flat(whole.params) - _flat(parts.params)).max() > 1e-2


def test_loss_mask_weights_only_target_positions(single):
    parts, tx, step = single
    host = image_text_batch(CFG, seed=1)
    tb = batch_lib.prepare_batch(host, CFG, 1)
    # The contract: position t-1 predicts input_ids[t], weighted by loss_mask[t].
    np.testing.assert_array_equal(tb.targets[0, :, :-1], host["input_ids"][:, 1:])
    np.testing.assert_array_equal(tb.weights[0, :, :-1], host["loss_mask"][:, 1:])
    assert not tb.weights[0, :, -1].any()
    state0 = init_train_state(parts.params, tx, 0, None)

    def loss_and_params(targets):
        b = tb._replace(targets=targets)
        state, metrics = step(state0, batch_lib.to_global(b, None))
        return float(metrics["loss"]), _flat(state.params)

    base_loss, base_params = loss_and_params(tb.targets)
    non_target = np.argwhere((tb.weights[0] == 0) & (tb.inputs.segment_ids[0] > 0))[3]  # predicts a prompt token
    target = np.argwhere(tb.weights[0] == 1)[2]
    for (r, t), changes in ((non_target, False), (target, True)):
        targets = tb.targets.copy()
        targets[0, r, t] = (targets[0, r, t] + 17) % CFG.text.vocab_size
        loss, params = loss_and_params(targets)
        if changes:
            assert abs(loss - base_loss) > 1e-4, (loss, base_loss)
            assert np.abs(params - base_params).max() > 0
        else:
            assert loss == base_loss
            np.testing.assert_array_equal(params, base_params)


def test_mesh_2x2x2_three_steps_equal_single_device(single):
    assert len(jax.devices()) == 8
    parts, tx, step = single
    host = image_text_batch(CFG, seed=2)  # images too: vision inputs replicated on the mesh
    want, want_losses, _ = _run(parts, tx, step, host, microbatches=1, steps=3)
    mesh = sharding.make_mesh((2, 2, 2))
    m_parts, m_tx, s_sh, m_step = _setup(mesh)
    q = m_parts.params["text"]["q_kernel"]
    assert q.addressable_shards[0].data.size < q.size  # really sharded
    got, got_losses, _ = _run(m_parts, m_tx, m_step, host, microbatches=1, steps=3, mesh=mesh, s_sh=s_sh)
    assert got.params["text"]["gate_kernel"].sharding.spec == s_sh.params["text"]["gate_kernel"].spec
    np.testing.assert_allclose(got_losses, want_losses, atol=1e-5, rtol=0)
    assert want_losses[2] < want_losses[0]
    np.testing.assert_allclose(_flat(got.params), _flat(want.params), atol=1e-5, rtol=0)
