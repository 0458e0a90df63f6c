"""The one attention function: segment-id masking, GQA, the block-causal split, finite padded rows."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rmsweb_jax.models import attention as attn


def _naive(q, k, v, q_seg, kv_seg, causal):
    b, t, h, d = q.shape
    rep = h // k.shape[2]
    k, v = np.repeat(k, rep, axis=2), np.repeat(v, rep, axis=2)
    out = np.zeros_like(q)
    for bi in range(b):
        for hi in range(h):
            logits = q[bi, :, hi] @ k[bi, :, hi].T / np.sqrt(d)
            mask = (q_seg[bi][:, None] == kv_seg[bi][None]) & (kv_seg[bi][None] != 0)
            if causal:
                mask &= np.arange(k.shape[1])[None] <= np.arange(t)[:, None]
            logits = np.where(mask, logits, -1e30)
            p = np.exp(logits - logits.max(-1, keepdims=True))
            out[bi, :, hi] = (p / p.sum(-1, keepdims=True)) @ v[bi, :, hi]
    return out


@pytest.mark.parametrize("t, causal", [(64, True), (512, True), (384, False)])
def test_matches_naive_with_packing_padding_and_gqa(t, causal):
    rng = np.random.default_rng(t)
    q = rng.standard_normal((2, t, 4, 16)).astype(np.float32)
    k = rng.standard_normal((2, t, 2, 16)).astype(np.float32)
    v = rng.standard_normal((2, t, 2, 16)).astype(np.float32)
    seg = np.ones((2, t), np.int32)
    seg[0, : t // 8] = 0                # left padding
    seg[1, t // 3:] = 2                 # two packed sequences
    got = attn.attention(jnp.asarray(q), jnp.asarray(k), jnp.asarray(v), q_segment_ids=jnp.asarray(seg),
                         kv_segment_ids=jnp.asarray(seg), causal=causal, impl="xla")
    want = _naive(q, k, v, seg, seg, causal)
    real = seg != 0
    np.testing.assert_allclose(np.asarray(got)[real], want[real], atol=2e-5)
    assert np.isfinite(np.asarray(got)).all()


def test_block_causal_split_equals_dense_path_values_and_gradients():
    rng = np.random.default_rng(0)
    q = jnp.asarray(rng.standard_normal((1, 512, 4, 8)), jnp.float32)
    k = jnp.asarray(rng.standard_normal((1, 512, 4, 8)), jnp.float32)
    seg = jnp.ones((1, 512), jnp.int32)
    pos = jnp.arange(512)[None]

    def split(q, k):
        return jnp.sum(jnp.sin(attn.attention(q, k, k, q_segment_ids=seg, kv_segment_ids=seg, causal=True)))

    def dense(q, k):
        return jnp.sum(jnp.sin(attn._xla(q, k, k, seg, seg, True, pos, pos, 8 ** -0.5)))

    np.testing.assert_allclose(split(q, k), dense(q, k), rtol=1e-5)
    for a, b in zip(jax.grad(split, (0, 1))(q, k), jax.grad(dense, (0, 1))(q, k)):
        np.testing.assert_allclose(a, b, atol=1e-5)


def test_shape_errors_are_named():
    with pytest.raises(ValueError, match="not a multiple"):
        attn.attention(jnp.zeros((1, 4, 3, 8)), jnp.zeros((1, 4, 2, 8)), jnp.zeros((1, 4, 2, 8)),
                       q_segment_ids=jnp.ones((1, 4)), kv_segment_ids=jnp.ones((1, 4)), causal=True)


@pytest.mark.slow
def test_splash_kernel_in_interpret_mode_matches_xla():
    # The TPU path (Pallas splash attention) run through the Pallas interpreter on CPU.
    rng = np.random.default_rng(7)
    q = jnp.asarray(rng.standard_normal((1, 256, 2, 128)), jnp.float32)
    k = jnp.asarray(rng.standard_normal((1, 256, 1, 128)), jnp.float32)
    v = jnp.asarray(rng.standard_normal((1, 256, 1, 128)), jnp.float32)
    seg = np.ones((1, 256), np.int32)
    seg[0, :40] = 0
    seg[0, 150:] = 2
    seg = jnp.asarray(seg)
    kw = dict(q_segment_ids=seg, kv_segment_ids=seg, causal=True)
    got = attn.attention(q, k, v, impl="splash_interpret", **kw)
    want = attn.attention(q, k, v, impl="xla", **kw)
    real = np.asarray(seg) != 0
    np.testing.assert_allclose(np.asarray(got)[real], np.asarray(want)[real], atol=2e-4)


def _small_inputs(t=16):
    rng = np.random.default_rng(3)
    q = jnp.asarray(rng.standard_normal((1, t, 2, 16)), jnp.float32)
    seg = jnp.ones((1, t), jnp.int32)
    return q, dict(q_segment_ids=seg, kv_segment_ids=seg, causal=True)


def test_cudnn_asked_for_by_name_raises_with_cudnns_reason():
    # float32: cuDNN refuses it on a GPU too (and on CPU there is no cuDNN at all).
    q, kw = _small_inputs()
    with pytest.raises(ValueError, match=r"config.model.attention_impl = 'cudnn': cuDNN attention refused "
                                         r"q \(1, 16, 2, 16\) k \(1, 16, 2, 16\) float32: .+'xla'"):
        attn.attention(q, q, q, impl="cudnn", **kw)


def test_cudnn_refusal_under_auto_falls_back_and_is_logged_once_per_shape(caplog):
    # "auto" resolves to cuDNN only on a GPU; its refusal path is the same function, run here on inputs
    # cuDNN really refuses (float32; on CPU there is no cuDNN at all).
    q, kw = _small_inputs(t=24)
    mask = attn._mask(kw["q_segment_ids"], kw["kv_segment_ids"], True, jnp.arange(24)[None], jnp.arange(24)[None])
    with caplog.at_level("WARNING"):
        assert attn._cudnn(q, q, q, mask, 0.25, requested="auto") is None
        assert attn._cudnn(q, q, q, mask, 0.25, requested="auto") is None
    lines = [r.getMessage() for r in caplog.records if "cuDNN attention refused" in r.getMessage()]
    assert len(lines) == 1 and "q (1, 24, 2, 16) k (1, 24, 2, 16) float32" in lines[0], lines
