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


@pytest.mark.parametrize("t", [1, 3])
def test_prefix_shared_attention_equals_float64_softmax_over_prefix_then_own_keys(t):
    """Cascade attention of G rows over one shared prefix + their own keys, against a float64 numpy softmax
    over each row's concatenated [prefix ; own] keys (the prefix repeated per row, as the copy path holds it)."""
    rng = np.random.default_rng(3)
    p, group, sp, s, h, kvh, d = 2, 3, 7, 5, 4, 2, 8
    b = p * group
    q = rng.normal(size=(b, t, h, d)).astype(np.float32)
    k, v = (rng.normal(size=(b, s, kvh, d)).astype(np.float32) for _ in range(2))
    pk, pv = (rng.normal(size=(p, sp, kvh, d)).astype(np.float32) for _ in range(2))
    prefix_seg = np.array([[0, 0, 1, 1, 1, 1, 1], [1] * sp], np.int32)  # left padding on the first prompt
    own_seg = np.zeros((b, s), np.int32)
    own_seg[:, :t + 1] = 1  # slots written so far: the queries' own and one before
    q_seg = np.ones((b, t), np.int32)
    q_pos = np.broadcast_to(1 + np.arange(t), (b, t)).astype(np.int32)
    kv_pos = np.broadcast_to(np.arange(s), (b, s)).astype(np.int32)
    got = attn.prefix_shared_attention(q, k, v, pk, pv, q_segment_ids=q_seg, kv_segment_ids=own_seg,
                                       prefix_segment_ids=prefix_seg, q_positions=q_pos, kv_positions=kv_pos)
    want = np.zeros((b, t, h, d))
    for row in range(b):
        keys = np.concatenate([pk[row // group], k[row]]).astype(np.float64)      # [Sp+S, KVH, D]
        vals = np.concatenate([pv[row // group], v[row]]).astype(np.float64)
        for i in range(t):
            own = (own_seg[row] != 0) & (kv_pos[row] <= q_pos[row, i])
            visible = np.concatenate([prefix_seg[row // group] != 0, own])
            for head in range(h):
                logits = keys[:, head // (h // kvh)] @ q[row, i, head].astype(np.float64) / np.sqrt(d)
                w = np.exp(logits[visible] - logits[visible].max())
                want[row, i, head] = (w / w.sum()) @ vals[visible, head // (h // kvh)]
    np.testing.assert_allclose(np.asarray(got), want, rtol=2e-5, atol=2e-6)


def test_merged_parts_equal_one_softmax_and_a_part_without_keys_weighs_nothing():
    rng = np.random.default_rng(4)
    logits = jnp.asarray(rng.normal(size=(3, 9)) * 4, jnp.float32)
    v = jnp.asarray(rng.normal(size=(3, 9, 5)), jnp.float32)
    whole = jnp.einsum("ms,msd->md", jax.nn.softmax(logits, axis=-1), v)
    a = attn.softmax_part(logits[:, None, :4], True, v[:, :4])
    b = attn.softmax_part(logits[:, None, 4:], True, v[:, 4:])
    np.testing.assert_allclose(np.asarray(attn.merge_parts(a, b))[:, 0], np.asarray(whole), rtol=1e-5, atol=1e-6)
    empty = attn.softmax_part(logits[:, None, 4:], False, v[:, 4:])
    np.testing.assert_allclose(np.asarray(attn.merge_parts(a, empty)), np.asarray(a[0]), rtol=1e-6, atol=1e-7)
