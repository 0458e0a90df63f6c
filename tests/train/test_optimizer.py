"""Optimizer config: warmup + cosine schedule, weight decay only on matrices, clipping, config errors."""
import jax.numpy as jnp
import numpy as np
import pytest

from rmsweb_jax.train.optimizer import OptimizerConfig, learning_rate_schedule, make_optimizer, weight_decay_mask


def test_schedule_warms_up_linearly_then_decays_by_cosine():
    cfg = OptimizerConfig(lr=1e-3, warmup_steps=10, total_steps=110, end_lr_fraction=0.1)
    lr = learning_rate_schedule(cfg)
    np.testing.assert_allclose([float(lr(s)) for s in (0, 5, 10)], [0.0, 5e-4, 1e-3], rtol=1e-6)
    np.testing.assert_allclose(float(lr(60)), 1e-4 + 0.5 * (1e-3 - 1e-4), rtol=1e-5)  # cosine halfway
    np.testing.assert_allclose(float(lr(110)), 1e-4, rtol=1e-5)


def test_weight_decay_skips_norms_and_biases_and_clipping_bounds_the_update():
    params = {"text": {"q_kernel": jnp.ones((2, 4, 4)), "input_norm": jnp.ones((2, 4))},
              "visual": {"fc1_bias": jnp.ones((2, 4))}}
    assert weight_decay_mask(params) == {"text": {"q_kernel": True, "input_norm": False},
                                         "visual": {"fc1_bias": False}}
    tx = make_optimizer(OptimizerConfig(lr=0.1, warmup_steps=0, total_steps=10, weight_decay=0.5, clip_norm=1.0))
    zero = {k: {n: jnp.zeros_like(v) for n, v in d.items()} for k, d in params.items()}
    updates, _ = tx.update(zero, tx.init(params), params)  # zero gradient: only decay moves parameters
    assert float(updates["text"]["q_kernel"][0, 0, 0]) == pytest.approx(-0.1 * 0.5)
    assert float(jnp.abs(updates["text"]["input_norm"]).max()) == 0.0
    huge = {k: {n: jnp.full_like(v, 1e6) for n, v in d.items()} for k, d in params.items()}
    clipped = make_optimizer(OptimizerConfig(lr=1.0, warmup_steps=0, total_steps=10, b1=0.0, clip_norm=1.0))
    updates, _ = clipped.update(huge, clipped.init(params), params)
    assert float(jnp.abs(updates["text"]["q_kernel"]).max()) <= 1.0 + 1e-6


@pytest.mark.parametrize("kwargs, message", [
    ({"warmup_steps": 20, "total_steps": 10}, r"warmup_steps: expected an integer in \[0, total_steps=10\], got 20"),
    ({"total_steps": 0}, r"total_steps: expected an integer >= 1, got 0"),
    ({"b2": 1.0}, r"b1/b2: expected values in \[0, 1\)"),
])
def test_bad_optimizer_config_names_the_key(kwargs, message):
    with pytest.raises(ValueError, match=r"config.train.optimizer\." + message):
        OptimizerConfig(**kwargs)
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['learning_rate'\]"):
        OptimizerConfig.from_config({"learning_rate": 1e-3})
