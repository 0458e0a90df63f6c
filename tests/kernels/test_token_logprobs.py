"""kernels.token_logprobs: every path against the naive log-softmax (values and gradients)."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from kernels import token_logprobs as tl
from kernels.token_logprobs_chunked import token_logprobs_chunked
from kernels.token_logprobs_gpu import token_logprobs_gpu
from kernels.token_logprobs_tpu import token_logprobs_tpu


def make_inputs(t, d, v, seed=0, dtype=jnp.float32, scale=1.0):
    rng = np.random.default_rng(seed)
    h = jnp.asarray(rng.normal(size=(t, d)), dtype)
    w = jnp.asarray(rng.normal(size=(d, v)) * scale / np.sqrt(d) * 3, dtype)
    y = jnp.asarray(rng.integers(0, v, size=t), jnp.int32)
    return h, w, y


def oracle(h, w, y, temperature):
    """Returns (logp, entropy) in float64 NumPy."""
    z = np.asarray(h, np.float64) @ np.asarray(w, np.float64) / temperature
    z = z - z.max(-1, keepdims=True)
    logp_all = z - np.log(np.exp(z).sum(-1, keepdims=True))
    logp = logp_all[np.arange(len(y)), np.asarray(y)]
    return logp, -(np.exp(logp_all) * logp_all).sum(-1)


def grads(fn, h, w, seed=1):
    """Returns d/d(h, W) of sum(c1 * logp + c2 * entropy) for fixed random c1, c2."""
    rng = np.random.default_rng(seed)
    c1, c2 = (jnp.asarray(rng.normal(size=h.shape[0]), jnp.float32) for _ in range(2))

    def loss(h, w):
        logp, ent = fn(h, w)
        out = jnp.sum(c1 * logp)
        return out + jnp.sum(c2 * ent) if ent is not None else out

    return jax.jit(jax.grad(loss, argnums=(0, 1)))(h, w)


def reference_fn(y, temperature, with_entropy):
    def fn(h, w):
        logp, ent = tl.token_logprobs_reference(h, w, y, temperature=temperature)
        return logp, (ent if with_entropy else None)
    return fn


def assert_grads_close(got, expected, rtol):
    for name, a, b in zip(("d_hidden", "d_lm_head"), got, expected):
        a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
        if not np.abs(b).any():
            # V = 1: the reference's gradients are exactly 0 (log-softmax of one logit); the kernels' online
            # softmax leaves fp32 rounding of 1 - p per token (~1.2e-7), times |h| <= 4 and |c1| + |c2| <= 3,
            # summed over up to 33 tokens: at most ~5e-5 (16 tokens gave 1.2e-6).
            np.testing.assert_allclose(a, b, atol=max(rtol * 0.1, 5e-5), err_msg=name)
            continue
        scale = max(float(np.abs(b).max()), 0.1)
        np.testing.assert_allclose(a / scale, b / scale, atol=rtol, err_msg=name)


def test_reference_matches_float64_oracle():
    h, w, y = make_inputs(9, 16, 50)
    logp, ent = tl.token_logprobs_reference(h, w, y, temperature=0.6)
    want_logp, want_ent = oracle(h, w, y, 0.6)
    np.testing.assert_allclose(np.asarray(logp), want_logp, atol=1e-5)
    np.testing.assert_allclose(np.asarray(ent), want_ent, atol=1e-5)


@settings(max_examples=10, deadline=None)
@given(t=st.integers(1, 33), d=st.integers(1, 20), v=st.integers(1, 700),
       block_v=st.sampled_from([16, 128, 512]), temperature=st.sampled_from([1.0, 0.5, 1.7]),
       seed=st.integers(0, 3))
def test_chunked_matches_reference(t, d, v, block_v, temperature, seed):
    h, w, y = make_inputs(t, d, v, seed)
    logp, ent = token_logprobs_chunked(h, w, y, temperature=temperature, return_entropy=True,
                                       block_v=block_v)
    want_logp, want_ent = tl.token_logprobs_reference(h, w, y, temperature=temperature)
    np.testing.assert_allclose(np.asarray(logp), np.asarray(want_logp), atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(ent), np.asarray(want_ent), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("with_entropy, temperature, v, block_v", [
    (False, 1.0, 1000, 128),  # ragged tail: 1000 = 7 * 128 + 104
    (True, 0.7, 512, 128),  # exact multiple
    (True, 1.3, 300, 512),  # one chunk narrower than the block
])
def test_chunked_gradients_match_naive_autodiff(with_entropy, temperature, v, block_v):
    h, w, y = make_inputs(24, 32, v, seed=2)
    ours = functools.partial(token_logprobs_chunked, targets=y, temperature=temperature,
                             return_entropy=with_entropy, block_v=block_v)
    got = grads(lambda h, w: ours(h, w), h, w)
    expected = grads(reference_fn(y, temperature, with_entropy), h, w)
    assert_grads_close(got, expected, rtol=1e-5)


def test_chunked_bf16_within_tolerance():
    # bf16 inputs: both sides multiply exact bf16 values in float32, so log-probs agree to
    # float32 rounding (1e-4 absolute); gradients come back in bf16 (8 bits of mantissa):
    # 1e-2 of the largest entry.
    h, w, y = make_inputs(40, 64, 1500, seed=3, dtype=jnp.bfloat16)
    logp, ent = token_logprobs_chunked(h, w, y, return_entropy=True, block_v=256)
    want_logp, want_ent = tl.token_logprobs_reference(h, w, y)
    np.testing.assert_allclose(np.asarray(logp), np.asarray(want_logp), atol=1e-4)
    np.testing.assert_allclose(np.asarray(ent), np.asarray(want_ent), atol=1e-4)
    ours = lambda h, w: token_logprobs_chunked(h, w, y, return_entropy=True, block_v=256)  # noqa
    got = grads(ours, h, w)
    assert got[0].dtype == jnp.bfloat16 and got[1].dtype == jnp.bfloat16
    assert_grads_close(got, grads(reference_fn(y, 1.0, True), h, w), rtol=1e-2)


def test_extreme_logits_stay_finite():
    # Logits of +-300: exp overflows without the running max; a near one-hot softmax.
    h, w, y = make_inputs(16, 8, 400, seed=4, scale=100.0)
    logp, ent = tl.token_logprobs(h, w, y, return_entropy=True, block_v=64)
    want_logp, want_ent = oracle(h, w, y, 1.0)
    assert np.isfinite(np.asarray(logp)).all() and np.isfinite(np.asarray(ent)).all()
    np.testing.assert_allclose(np.asarray(logp), want_logp, rtol=1e-5, atol=1e-3)
    np.testing.assert_allclose(np.asarray(ent), want_ent, atol=1e-3)
    assert (np.asarray(ent) >= -1e-6).all()


# Pallas in interpret mode: small shapes, each case compiles three kernels.
PALLAS_CASES = {
    "tpu_ragged_entropy": dict(t=20, d=32, v=300, temperature=0.8, with_entropy=True,
                               blocks=dict(block_t=8, block_v=128)),
    "tpu_exact_blocks": dict(t=16, d=16, v=256, temperature=1.0, with_entropy=False,
                             blocks=dict(block_t=8, block_v=128)),
    "gpu_ragged_t_v_d": dict(t=20, d=40, v=100, temperature=0.8, with_entropy=True,
                             blocks=dict(block_t=16, block_v=32, block_d=16)),
}


@pytest.mark.parametrize("case", sorted(PALLAS_CASES))
def test_pallas_interpret_matches_reference(case):
    c = PALLAS_CASES[case]
    h, w, y = make_inputs(c["t"], c["d"], c["v"], seed=5)
    kernel = token_logprobs_gpu if case.startswith("gpu") else token_logprobs_tpu
    ours = functools.partial(kernel, targets=y, temperature=c["temperature"],
                             return_entropy=c["with_entropy"], interpret=True, **c["blocks"])
    logp, ent = jax.jit(lambda h, w: ours(h, w))(h, w)
    want_logp, want_ent = tl.token_logprobs_reference(h, w, y, temperature=c["temperature"])
    np.testing.assert_allclose(np.asarray(logp), np.asarray(want_logp), atol=1e-5, rtol=1e-5)
    if c["with_entropy"]:
        np.testing.assert_allclose(np.asarray(ent), np.asarray(want_ent), atol=1e-5, rtol=1e-5)
    got = grads(lambda h, w: ours(h, w), h, w)
    expected = grads(reference_fn(y, c["temperature"], c["with_entropy"]), h, w)
    assert_grads_close(got, expected, rtol=1e-5)


@pytest.mark.slow  # two layouts x (forward + gradient kernels) in interpret mode
def test_pallas_interpret_bf16_within_tolerance():
    h, w, y = make_inputs(24, 32, 300, seed=6, dtype=jnp.bfloat16)
    for kernel, blocks in ((token_logprobs_tpu, dict(block_t=8, block_v=128)),
                           (token_logprobs_gpu, dict(block_t=16, block_v=64, block_d=16))):
        ours = functools.partial(kernel, targets=y, return_entropy=True, interpret=True, **blocks)
        logp, ent = ours(h, w)
        want_logp, want_ent = tl.token_logprobs_reference(h, w, y)
        np.testing.assert_allclose(np.asarray(logp), np.asarray(want_logp), atol=1e-4)
        np.testing.assert_allclose(np.asarray(ent), np.asarray(want_ent), atol=1e-4)
        assert_grads_close(grads(lambda h, w: ours(h, w), h, w),
                           grads(reference_fn(y, 1.0, True), h, w), rtol=1e-2)


@pytest.mark.slow  # each new shape compiles three kernels in interpret mode
@settings(max_examples=4, deadline=None)
@given(t=st.integers(1, 30), d=st.sampled_from([8, 24]), v=st.integers(1, 400),
       with_entropy=st.booleans())
@example(t=16, d=8, v=1, with_entropy=True)  # one logit: exact zeros against fp32 rounding (a make test run found it)
def test_pallas_tpu_layout_random_shapes(t, d, v, with_entropy):
    h, w, y = make_inputs(t, d, v, seed=t + v)
    logp, ent = token_logprobs_tpu(h, w, y, temperature=0.9, return_entropy=with_entropy,
                                   block_t=8, block_v=128, interpret=True)
    want_logp, want_ent = tl.token_logprobs_reference(h, w, y, temperature=0.9)
    np.testing.assert_allclose(np.asarray(logp), np.asarray(want_logp), atol=1e-5, rtol=1e-5)
    if with_entropy:
        np.testing.assert_allclose(np.asarray(ent), np.asarray(want_ent), atol=1e-5, rtol=1e-5)
    ours = functools.partial(token_logprobs_tpu, targets=y, temperature=0.9,
                             return_entropy=with_entropy, block_t=8, block_v=128, interpret=True)
    assert_grads_close(grads(lambda h, w: ours(h, w), h, w),
                       grads(reference_fn(y, 0.9, with_entropy), h, w), rtol=1e-5)


def test_mixed_dtypes_run_on_every_path():
    h, w, y = make_inputs(10, 16, 130, seed=8)
    want = tl.token_logprobs(h.astype(jnp.bfloat16).astype(jnp.float32), w, y, impl="reference")
    for impl in ("chunked", "pallas_interpret"):
        got = tl.token_logprobs(h.astype(jnp.bfloat16), w, y, impl=impl)
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-5, err_msg=impl)


def test_public_api_shapes_and_default_path():
    h, w, y = make_inputs(12, 16, 200, seed=7)
    hb, yb = h.reshape(3, 4, 16), y.reshape(3, 4)
    logp = tl.token_logprobs(hb, w, yb, temperature=0.9)
    logp2, ent = tl.token_logprobs(hb, w, yb, temperature=0.9, return_entropy=True)
    want_logp, want_ent = tl.token_logprobs_reference(h, w, y, temperature=0.9)
    assert logp.shape == (3, 4) and ent.shape == (3, 4)
    np.testing.assert_allclose(np.asarray(logp).ravel(), np.asarray(want_logp), atol=1e-5)
    np.testing.assert_allclose(np.asarray(logp2).ravel(), np.asarray(want_logp), atol=1e-5)
    np.testing.assert_allclose(np.asarray(ent).ravel(), np.asarray(want_ent), atol=1e-5)
    # On CPU the default is the chunked loop: no pallas_call and no [T, V] array anywhere.
    jaxpr = str(jax.make_jaxpr(jax.grad(lambda h, w: tl.token_logprobs(h, w, y, block_v=64)
                                        .sum(), argnums=(0, 1)))(h, w))
    assert "pallas_call" not in jaxpr and "12,200]" not in jaxpr
    assert "12,200]" in str(jax.make_jaxpr(
        lambda h, w: tl.token_logprobs(h, w, y, impl="reference"))(h, w))


@pytest.mark.parametrize("args, kwargs, match", [
    ((np.zeros(4), np.zeros((4, 8)), np.zeros((), int)), {}, "hidden must be"),
    ((np.zeros((3, 4)), np.zeros((5, 8)), np.zeros(3, int)), {}, "lm_head"),
    ((np.zeros((3, 4)), np.zeros(8), np.zeros(3, int)), {}, "lm_head must be"),
    ((np.zeros((3, 4)), np.zeros((4, 8)), np.zeros(2, int)), {}, "targets shape"),
    ((np.zeros((3, 4)), np.zeros((4, 8)), np.zeros(3)), {}, "integer"),
    ((np.zeros((3, 4)), np.zeros((4, 8)), np.zeros(3, int)), {"temperature": 0.0}, "temperature"),
    ((np.zeros((3, 4)), np.zeros((4, 8)), np.zeros(3, int)), {"temperature": -1}, "temperature"),
    ((np.zeros((3, 4)), np.zeros((4, 8)), np.zeros(3, int)), {"impl": "fast"}, "impl"),
    ((np.zeros((3, 4)), np.zeros((4, 8)), np.zeros(3, int)), {"impl": "pallas"}, "pallas"),
    ((np.zeros((3, 4)), np.zeros((4, 8)), np.zeros(3, int)), {"block_v": 0}, "block_v"),
    ((np.zeros((20, 4)), np.zeros((4, 300)), np.zeros(20, int)),
     {"impl": "pallas_interpret", "block_v": 100}, "block_v"),
])
def test_bad_inputs_raise_value_error(args, kwargs, match):
    with pytest.raises(ValueError, match=match):
        tl.token_logprobs(*args, **kwargs)


def test_traced_temperature_is_rejected():
    h, w, y = make_inputs(4, 8, 16)
    with pytest.raises(ValueError, match="static"):
        jax.jit(lambda t: tl.token_logprobs(h, w, y, temperature=t))(1.0)


def test_gpu_block_sizes_must_be_powers_of_two():
    h, w, y = make_inputs(4, 8, 16)
    with pytest.raises(ValueError, match="power of two"):
        token_logprobs_gpu(h, w, y, block_v=48, interpret=True)
