"""Splash attention on a multi-device mesh runs per device inside shard_map (a Mosaic kernel cannot be
partitioned by XLA): on 8 CPU devices, through the Pallas interpreter, it equals the XLA path, values and
gradients, with batch and heads split, with heads left whole when they do not divide, and with a band."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from rmsweb_jax.models import attention as attn
from rmsweb_jax.models import sharding

pytestmark = pytest.mark.slow  # the Pallas interpreter runs the kernel op by op


def _inputs(b, t, h, kvh, d=128, seed=0):
    rng = np.random.default_rng(seed)
    q, k, v = (jnp.asarray(rng.standard_normal(s), jnp.float32) for s in ((b, t, h, d), (b, t, kvh, d), (b, t, kvh, d)))
    seg = np.ones((b, t), np.int32)
    seg[0, :40] = 0                               # left padding
    seg[1 % b, 150:] = 2                          # two packed sequences
    seg[2 % b] = np.repeat(np.arange(1, 5), t // 4)  # four segments (images)
    return q, k, v, jnp.asarray(seg)


def _sharded_splash(mesh, causal, window=None):
    def run(q, k, v, seg):
        return attn.attention(q, k, v, q_segment_ids=seg, kv_segment_ids=seg, causal=causal, impl="splash_interpret",
                              window=window, mesh=mesh)
    return jax.jit(run)


def _xla(q, k, v, seg, causal):
    return attn.attention(q, k, v, q_segment_ids=seg, kv_segment_ids=seg, causal=causal, impl="xla")


def test_specs_split_batch_and_heads_only_when_both_head_counts_divide():
    mesh = sharding.make_mesh((2, 2, 2))
    rules = sharding.DEFAULT_RULES
    both = PartitionSpec(("data", "fsdp"), None, "tensor", None)
    assert attn._splash_specs((4, 256, 4, 128), (4, 256, 2, 128), mesh, rules, ("q_heads", "kv_heads")) == (both, both)
    whole = PartitionSpec(("data", "fsdp"), None, None, None)
    assert attn._splash_specs((4, 256, 4, 128), (4, 256, 1, 128), mesh, rules, ("q_heads", "kv_heads")) == (whole,
                                                                                                           whole)
    # One row (the vision tower's): replicated over data x fsdp, heads still split.
    one = PartitionSpec(None, None, "tensor", None)
    assert attn._splash_specs((1, 256, 4, 72), (1, 256, 4, 72), mesh, rules, ("vision_heads", "vision_heads")) == (
        one, one)


@pytest.mark.parametrize("causal", [True, False])
def test_sharded_splash_equals_xla_with_batch_and_heads_split(causal):
    mesh = sharding.make_mesh((2, 2, 2))
    q, k, v, seg = _inputs(4, 256, 4, 2)
    run = _sharded_splash(mesh, causal)
    assert "manual_axes" in run.lower(q, k, v, seg).as_text()  # a shard_map, not a replicated kernel
    got = run(q, k, v, seg)
    real = np.asarray(seg) != 0
    np.testing.assert_allclose(np.asarray(got)[real], np.asarray(_xla(q, k, v, seg, causal))[real], atol=2e-5)


def test_sharded_splash_gradients_equal_xla_with_heads_whole_and_t_padded_to_128():
    # One key/value head cannot split over tensor=2: heads stay whole; T=200 is padded to 256 inside.
    mesh = sharding.make_mesh((2, 2, 2))
    q, k, v, seg = _inputs(4, 200, 2, 1)
    real = (np.asarray(seg) != 0)[..., None, None].astype(np.float32)
    w = jnp.asarray(np.random.default_rng(1).standard_normal(q.shape).astype(np.float32) * real)
    on_mesh = NamedSharding(mesh, PartitionSpec(("data", "fsdp")))
    q, k, v, seg = (jax.device_put(x, on_mesh) for x in (q, k, v, seg))

    def loss(fn):
        return lambda q, k, v: jnp.sum(fn(q, k, v, seg) * w)

    splash = _sharded_splash(mesh, True)
    got = jax.jit(jax.value_and_grad(loss(splash), (0, 1, 2)))(q, k, v)
    want = jax.value_and_grad(loss(lambda *a: _xla(*a, True)), (0, 1, 2))(q, k, v)
    np.testing.assert_allclose(got[0], want[0], atol=2e-4)  # a sum over 200k products
    for a, b in zip(got[1], want[1]):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=2e-5)


def test_sharded_banded_splash_equals_xla_on_segments_within_the_window():
    mesh = sharding.make_mesh((1, 2, 4))
    q, k, v, _ = _inputs(1, 256, 4, 4)
    sizes = [64, 17, 33, 64, 1, 25, 40]  # the last 12 positions are padding
    seg = jnp.asarray(np.pad(np.repeat(np.arange(1, 8), sizes), (0, 256 - sum(sizes)))[None].astype(np.int32))
    got = _sharded_splash(mesh, False, window=64)(q, k, v, seg)
    real = np.asarray(seg) != 0
    np.testing.assert_allclose(np.asarray(got)[real], np.asarray(_xla(q, k, v, seg, False))[real], atol=2e-5)
