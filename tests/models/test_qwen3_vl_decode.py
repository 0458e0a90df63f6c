"""Decode steps over the per-layer weight layout (models/qwen3_vl/decode.py) give the stacked path's logits
and cache, for every shape family of the parity tests, with both products of a few rows by a matrix (XLA's dot over
[in, out] matrices; the fused multiply-reduce over [out, in], and its one-row dot), whichever this host takes; and
over a shared prefix (group decoding), the logits of the prompt cache copied to every row."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rmsweb_jax.models.qwen3_vl import KVCache, ModelInputs, RuntimeOptions, create, prepare_inputs, tiny
from rmsweb_jax.models.qwen3_vl import decode

CASES = {
    "gqa_untied": dict(),
    "tied": dict(tie_word_embeddings=True),
    "heads_x_head_dim_ne_hidden": dict(head_dim=32, num_attention_heads=4, num_key_value_heads=1),
}


def _prompt(cfg, batch: int, rng):
    """Left-padded text rows of different lengths; with 3+ rows, row 0 holds a 2x4-patch image."""
    lengths = [5, 12, 9, 7][:batch]
    ids = np.zeros((batch, 12), np.int32)
    mask = np.zeros_like(ids)
    for i, n in enumerate(lengths):
        ids[i, 12 - n:] = rng.integers(10, cfg.text.vocab_size, n)
        mask[i, 12 - n:] = 1
    kw = {}
    if batch >= 3:
        ids[0, 8:10] = cfg.image_token_id
        kw = dict(pixel_values=rng.standard_normal((8, cfg.vision.patch_dim)).astype(np.float32),
                  image_grid_thw=np.array([[1, 2, 4]]))
    return prepare_inputs(cfg, ids, attention_mask=mask, **kw)


@pytest.mark.parametrize("fused_rows", [False, True], ids=["dot", "fused"])
@pytest.mark.parametrize("case,batch", [(c, 3) for c in sorted(CASES)] + [("gqa_untied", 1)])
def test_per_layer_steps_equal_stacked_steps(case, batch, fused_rows):
    cfg = tiny(**CASES[case])
    model = create(cfg, seed=7)
    inputs = _prompt(cfg, batch, np.random.default_rng(batch))
    graphdef, state = nnx.split(model)

    @jax.jit
    def run(state, inputs):
        m = nnx.merge(graphdef, state)
        cache = KVCache.zeros(cfg.text, batch, inputs.input_ids.shape[1] + 2)
        hidden, cache = m.hidden_states(inputs, cache)
        first = jnp.argmax(m.logits(hidden[:, -1:])[:, 0], axis=-1).astype(jnp.int32)
        next_pos = jnp.max(inputs.position_ids, axis=(0, 2)) + 1
        weights, step_cache = decode.step_weights(m.text, fused_rows), decode.step_cache(cache)
        stacked, per_layer, tok = [], [], (first, first)
        for step in range(2):
            pos = jnp.broadcast_to((next_pos + step)[None, :, None], (3, batch, 1)).astype(jnp.int32)
            step_inputs = ModelInputs(tok[0][:, None], jnp.ones((batch, 1), jnp.int32), pos, None, inputs.rope_deltas)
            h, cache = m.hidden_states(step_inputs, cache)
            stacked.append(m.logits(h)[:, 0])
            h2, step_cache = decode.step_hidden(m.text, weights, step_cache, tok[1], pos)
            per_layer.append(decode.step_logits(weights, h2))
            tok = (jnp.argmax(stacked[-1], -1).astype(jnp.int32), jnp.argmax(per_layer[-1], -1).astype(jnp.int32))
        return stacked, per_layer, cache, step_cache

    stacked, per_layer, cache, step_cache = run(state, inputs)
    for a, b in zip(stacked, per_layer):
        assert a.shape == b.shape == (batch, cfg.text.vocab_size)
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), atol=2e-5, rtol=1e-5)
    for layer in range(cfg.text.num_hidden_layers):  # heads-major per-layer buffers hold the same entries
        np.testing.assert_allclose(np.asarray(step_cache.k[layer]), np.asarray(cache.k[layer]).transpose(0, 2, 1, 3),
                                   atol=2e-5)
        np.testing.assert_allclose(np.asarray(step_cache.v[layer]), np.asarray(cache.v[layer]).transpose(0, 2, 1, 3),
                                   atol=2e-5)
    np.testing.assert_array_equal(np.asarray(step_cache.segment_ids), np.asarray(cache.segment_ids))
    assert int(step_cache.index) == int(cache.index)


def test_steps_over_a_shared_prefix_equal_steps_over_its_copies():
    """G = 2 rows per prompt, 2 left-padded prompts: decode steps over one key-minor copy of each prompt's cache
    (`prefix_cache`) plus the rows' own slots give the logits of steps over the prompt cache copied to every row."""
    cfg = tiny()
    model = create(cfg, seed=3)
    prompts, group, steps = 2, 2, 3
    inputs = _prompt(cfg, prompts, np.random.default_rng(5))
    graphdef, state = nnx.split(model)
    length = inputs.input_ids.shape[1]

    @jax.jit
    def run(state, inputs):
        m = nnx.merge(graphdef, state)
        cache = KVCache.zeros(cfg.text, prompts, length + steps)
        hidden, cache = m.hidden_states(inputs, cache)
        weights = decode.step_weights(m.text)
        rows = jnp.repeat(jnp.arange(prompts), group)  # prompt-major: rows 0, 1 share prompt 0
        copied = decode.step_cache(KVCache(cache.k[:, rows], cache.v[:, rows], cache.segment_ids[rows], cache.index))
        prefix = decode.prefix_cache(KVCache(cache.k[:, :, :length], cache.v[:, :, :length],
                                             cache.segment_ids[:, :length], cache.index))
        own = decode.step_cache(KVCache.zeros(cfg.text, prompts * group, steps))
        tokens = jnp.argmax(m.logits(hidden[:, -1:])[:, 0], axis=-1).astype(jnp.int32)[rows]
        next_pos = (jnp.max(inputs.position_ids, axis=(0, 2)) + 1)[rows]
        out = []
        for step in range(steps):
            pos = jnp.broadcast_to((next_pos + step)[None, :, None], (3, prompts * group, 1)).astype(jnp.int32)
            h, copied = decode.step_hidden(m.text, weights, copied, tokens, pos)
            h2, own = decode.step_hidden(m.text, weights, own, tokens, pos, prefix)
            out.append((decode.step_logits(weights, h), decode.step_logits(weights, h2)))
            tokens = (tokens + 7 * step + jnp.arange(prompts * group)) % cfg.text.vocab_size  # rows apart
        return out, prefix, cache

    out, prefix, cache = run(state, inputs)
    for copies, shared in out:
        np.testing.assert_allclose(np.asarray(shared), np.asarray(copies), atol=2e-5, rtol=1e-5)
    for layer in range(cfg.text.num_hidden_layers):  # keys key-minor [P, KVH, hd, S], values heads-major
        np.testing.assert_array_equal(np.asarray(prefix.k[layer]),
                                      np.asarray(cache.k[layer, :, :length]).transpose(0, 2, 3, 1))
        np.testing.assert_array_equal(np.asarray(prefix.v[layer]),
                                      np.asarray(cache.v[layer, :, :length]).transpose(0, 2, 1, 3))


@pytest.mark.parametrize("tied", [False, True])
def test_step_weights_are_out_by_in_for_the_fused_product_else_in_by_out(tied):
    cfg = tiny(tie_word_embeddings=tied)
    model = create(cfg, seed=1)
    t = cfg.text
    qkv = (t.num_attention_heads + 2 * t.num_key_value_heads) * t.head_dim
    head = np.asarray(model.text.embed[...] if tied else model.text.lm_head[...].T)  # [V, D]
    for fused_rows in (True, False):
        w = decode.step_weights(model.text, fused_rows)
        assert w.fused_rows is fused_rows and len(w.layers) == t.num_hidden_layers
        shapes = {"qkv": (qkv, t.hidden_size), "o": (t.hidden_size, t.num_attention_heads * t.head_dim),
                  "gate_up": (2 * t.intermediate_size, t.hidden_size), "down": (t.hidden_size, t.intermediate_size)}
        flip = (lambda shape: shape) if fused_rows else (lambda shape: shape[::-1])
        for name, shape in shapes.items():
            assert w.layers[0][name].shape == flip(shape), (fused_rows, name)
        down = np.asarray(model.text.down_kernel[1])  # [I, D]
        np.testing.assert_array_equal(np.asarray(w.layers[1]["down"]), down.T if fused_rows else down)
        np.testing.assert_array_equal(np.asarray(w.head), head if fused_rows else head.T)
        gate_up = np.concatenate([np.asarray(model.text.gate_kernel[0]), np.asarray(model.text.up_kernel[0])], 1)
        np.testing.assert_array_equal(np.asarray(w.layers[0]["gate_up"]), gate_up.T if fused_rows else gate_up)
    assert decode.step_weights(model.text).fused_rows is decode.fused_rows_default()


def test_decode_layout_resolution_and_bad_values(monkeypatch):
    cfg = tiny(num_hidden_layers=2)
    model = create(cfg)
    assert decode.use_per_layer(model)  # auto: CPU, no mesh, a small copy
    copy = decode.copy_bytes(model.text)
    assert copy == 4 * sum(x.size for x in jax.tree.leaves(decode.step_weights(model.text).layers)
                           if x.ndim == 2) + 4 * cfg.text.vocab_size * cfg.text.hidden_size
    monkeypatch.setattr(decode, "AUTO_MAX_COPY_BYTES", copy - 1)
    assert not decode.use_per_layer(model)  # auto keeps big models on the stacked path
    monkeypatch.undo()
    assert not decode.use_per_layer(create(cfg, RuntimeOptions(decode_layout="stacked")))
    assert decode.use_per_layer(create(cfg, RuntimeOptions(decode_layout="per_layer")))
    with pytest.raises(ValueError, match="decode_layout"):
        RuntimeOptions(decode_layout="transposed")
