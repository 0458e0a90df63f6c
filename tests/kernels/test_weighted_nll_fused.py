"""kernels.weighted_nll_fused: value and gradients against autodiff of the naive log-softmax."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernels.token_logprobs import token_logprobs_reference
from kernels.weighted_nll_fused import weighted_nll_fused


def make_inputs(t, d, v, seed=0):
    rng = np.random.default_rng(seed)
    h = jnp.asarray(rng.normal(size=(t, d)), jnp.float32)
    w = jnp.asarray(rng.normal(size=(d, v)) / np.sqrt(d) * 3, jnp.float32)
    y = jnp.asarray(rng.integers(0, v, size=t), jnp.int32)
    weights = jnp.asarray(rng.normal(size=t), jnp.float32).at[::5].set(0.0)  # signed, like advantages
    return h, w, y, weights


def naive(h, w, y, weights):
    logp, _ = token_logprobs_reference(h, w, y)
    return -jnp.sum(weights * logp)


@pytest.mark.parametrize("t,rows", [(37, 8), (64, 64), (50, 512), (33, 1)])
def test_value_and_gradients_match_naive(t, rows):
    h, w, y, weights = make_inputs(t, 24, 300)
    ours, (dh, dw) = jax.jit(jax.value_and_grad(lambda h, w: weighted_nll_fused(h, w, y, weights, rows=rows),
                                                argnums=(0, 1)))(h, w)
    ref, (rdh, rdw) = jax.jit(jax.value_and_grad(lambda h, w: naive(h, w, y, weights), argnums=(0, 1)))(h, w)
    np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(dh, rdh, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(dw, rdw, rtol=1e-4, atol=1e-5)
    # Without differentiation the same value comes out (the value-only path).
    np.testing.assert_allclose(jax.jit(lambda: weighted_nll_fused(h, w, y, weights, rows=rows))(), ref,
                               rtol=1e-5, atol=1e-4)


def test_cotangent_scales_gradients_and_batched_leading_dims():
    h, w, y, weights = make_inputs(24, 16, 100)
    hb, yb, wb = h.reshape(2, 12, 16), y.reshape(2, 12), weights.reshape(2, 12)
    g = jax.grad(lambda h, w: -3.0 * weighted_nll_fused(h, w, yb, wb, rows=5), argnums=(0, 1))(hb, w)
    r = jax.grad(lambda h, w: -3.0 * naive(h, w, y, weights), argnums=(0, 1))(h, w)
    np.testing.assert_allclose(g[0].reshape(24, 16), r[0], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(g[1], r[1], rtol=1e-4, atol=1e-5)


def test_weight_zero_rows_give_nothing_even_with_nonfinite_hidden():
    h, w, y, weights = make_inputs(10, 8, 50)
    weights = weights.at[3].set(0.0)
    h = h.at[3].set(jnp.inf)
    value, (dh, dw) = jax.value_and_grad(lambda h, w: weighted_nll_fused(h, w, y, weights, rows=4),
                                         argnums=(0, 1))(h, w)
    assert np.isfinite(value) and np.isfinite(np.asarray(dw)).all()
    assert np.all(np.asarray(dh)[3] == 0)
    keep = np.arange(10) != 3
    ref = naive(h[keep], w, y[keep], weights[keep])
    np.testing.assert_allclose(value, ref, rtol=1e-5)


def test_bad_shapes_are_named():
    h, w, y, weights = make_inputs(6, 8, 20)
    with pytest.raises(ValueError, match=r"targets \(5,\)"):
        weighted_nll_fused(h, w, y[:5], weights[:5])
    with pytest.raises(ValueError, match=r"lm_head \(9, 20\)"):
        weighted_nll_fused(h, jnp.zeros((9, 20)), y, weights)
    with pytest.raises(ValueError, match="rows"):
        weighted_nll_fused(h, w, y, weights, rows=0)
