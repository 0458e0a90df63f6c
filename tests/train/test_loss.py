"""train.loss: every loss path gives the same (sum, denominator) and gradients; which path 'auto' picks."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rmsweb_jax.models.sharding import make_mesh
from rmsweb_jax.train.loss import LOSS_IMPLS, resolve_loss_impl, token_cross_entropy


def inputs(seed=0):
    rng = np.random.default_rng(seed)
    hidden = jnp.asarray(rng.normal(size=(3, 11, 16)), jnp.float32)
    head = jnp.asarray(rng.normal(size=(16, 90)) / 4, jnp.float32)
    targets = jnp.asarray(rng.integers(0, 90, (3, 11)), jnp.int32)
    weights = jnp.asarray(rng.integers(0, 2, (3, 11)), jnp.float32).at[:, -1].set(0)
    return hidden, head, targets, weights


@pytest.mark.parametrize("impl", ["fused", "chunked", "pallas_interpret"])
def test_paths_equal_reference_value_and_gradients(impl):
    hidden, head, targets, weights = inputs()

    def loss(impl):
        def f(h, w):
            return token_cross_entropy(h, w, targets, weights, impl=impl).value()
        return jax.jit(jax.value_and_grad(f, argnums=(0, 1)))(hidden, head)

    value, (dh, dw) = loss(impl)
    ref, (rdh, rdw) = loss("reference")
    np.testing.assert_allclose(value, ref, rtol=1e-5)
    np.testing.assert_allclose(dh, rdh, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(dw, rdw, rtol=1e-4, atol=1e-6)
    parts = token_cross_entropy(hidden, head, targets, weights, impl=impl)
    assert float(parts.denominator) == float(weights.sum())


def test_auto_is_fused_on_one_cpu_device_and_chunked_on_a_mesh():
    assert jax.default_backend() == "cpu"
    assert resolve_loss_impl("auto", None) == "fused"
    assert resolve_loss_impl("auto", make_mesh((1, 8, 1))) == "chunked"
    assert resolve_loss_impl("fused", None) == "fused"
    with pytest.raises(ValueError, match="loss_impl = 'fast'"):
        resolve_loss_impl("fast", None)
    assert "fused" in LOSS_IMPLS
