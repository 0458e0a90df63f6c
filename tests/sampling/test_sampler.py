"""The KV-cache sampler: greedy tokens equal transformers' `generate`; sampling knobs behave."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from rmsweb_jax.models.qwen3_vl import params
from rmsweb_jax.models.qwen3_vl.config import RuntimeOptions
from rmsweb_jax.sampling.sampler import Sampler, SamplingParams, never_sampled, sample_token
from tests.models import hf_reference as ref

NEW = 32


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    d = tmp_path_factory.mktemp("qwen3vl_sampler")
    torch_model = ref.write_checkpoint(d, seed=31)
    torch_model.generation_config.eos_token_id = None
    torch_model.generation_config.pad_token_id = 0
    return torch_model, d


@pytest.fixture(scope="module", params=["per_layer", "stacked"])
def models(request, checkpoint):
    """The HF reference and our model, decoding through each decode layout (models/qwen3_vl/decode.py)."""
    torch_model, d = checkpoint
    return torch_model, params.from_hf(d, runtime=RuntimeOptions(decode_layout=request.param))


def _hf_generate(torch_model, rows, pixels=None, grids=None):
    ids, mask = ref.left_pad(rows)
    kw = {}
    if pixels is not None:
        kw = dict(pixel_values=torch.from_numpy(pixels), image_grid_thw=torch.tensor(grids),
                  mm_token_type_ids=torch.from_numpy((ids == ref.IMAGE_TOKEN).astype(np.int64)))
    with torch.no_grad():
        out = torch_model.generate(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask),
                                   max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False, **kw)
    return out[:, ids.shape[1]:].numpy()


def test_greedy_matches_hf_generate_text_prompts_of_different_lengths(models):
    torch_model, model = models
    rng = np.random.default_rng(1)
    rows = [[int(t) for t in rng.integers(10, ref.VOCAB, n)] for n in (3, 17, 9, 30)]
    expected = _hf_generate(torch_model, rows)
    got = Sampler(model).generate(rows, SamplingParams(max_new_tokens=NEW))
    np.testing.assert_array_equal(got.tokens, expected)
    assert (got.lengths == NEW).all() and not got.finished.any()
    assert (got.logprobs <= 0).all() and (got.logprobs > -50).all()


def test_greedy_matches_hf_generate_with_images(models):
    torch_model, model = models
    rng = np.random.default_rng(2)
    grids = [[1, 4, 6], [1, 8, 4]]
    rows, pixels = ref.image_prompt(rng, grids, texts_before=(2, 9), texts_after=(5, 1))
    expected = _hf_generate(torch_model, rows, pixels, grids)
    got = Sampler(model, patch_bucket=64).generate(rows, SamplingParams(max_new_tokens=NEW), pixel_values=pixels,
                                                   image_grid_thw=np.array(grids))
    np.testing.assert_array_equal(got.tokens, expected)


def test_logprobs_equal_the_full_forward_and_stop_tokens_end_rows(models):
    _, model = models
    rng = np.random.default_rng(3)
    rows = [[int(t) for t in rng.integers(10, ref.VOCAB, n)] for n in (6, 11)]
    out = Sampler(model).generate(rows, SamplingParams(max_new_tokens=8))
    for row, toks, lps in zip(rows, out.tokens, out.logprobs):
        full = np.asarray(row + list(toks))[None]
        logits = np.asarray(model(full).logits)[0]
        logp = jax.nn.log_softmax(jnp.asarray(logits), axis=-1)
        want = [float(logp[len(row) - 1 + i, t]) for i, t in enumerate(toks)]
        np.testing.assert_allclose(lps, want, atol=1e-4)
    stop = int(out.tokens[0, 3])
    stopped = Sampler(model).generate(rows, SamplingParams(max_new_tokens=8, stop_token_ids=(stop,)))
    first_stop = int(np.argmax(out.tokens[0] == stop))
    assert stopped.finished[0] and stopped.lengths[0] == first_stop + 1
    assert (stopped.tokens[0, first_stop + 1:] == 0).all() and (stopped.logprobs[0, first_stop + 1:] == 0).all()


def test_sampling_knobs():
    logits = jnp.log(jnp.array([[0.5, 0.3, 0.15, 0.05]] * 2000))
    keys = jax.random.split(jax.random.key(0), 1)[0]
    tok, _ = sample_token(logits, keys, jnp.float32(1.0), jnp.float32(1.0), jnp.int32(2))
    assert set(np.asarray(tok).tolist()) == {0, 1}
    tok, _ = sample_token(logits, keys, jnp.float32(1.0), jnp.float32(0.7), jnp.int32(0))
    assert set(np.asarray(tok).tolist()) == {0, 1}
    tok, lp = sample_token(logits, keys, jnp.float32(1.0), jnp.float32(1.0), jnp.int32(0))
    freq = np.bincount(np.asarray(tok), minlength=4) / 2000
    np.testing.assert_allclose(freq, [0.5, 0.3, 0.15, 0.05], atol=0.04)
    np.testing.assert_allclose(np.exp(np.asarray(lp)), np.array([0.5, 0.3, 0.15, 0.05])[np.asarray(tok)], rtol=1e-5)
    tok, _ = sample_token(logits, keys, jnp.float32(0.0), jnp.float32(1.0), jnp.int32(0))
    assert (np.asarray(tok) == 0).all()


def test_suppressed_tokens_are_never_drawn_and_greedy_agrees_until_the_first_one(models):
    _, model = models
    banned = never_sampled(model.config)
    rng = np.random.default_rng(1)
    rows = [[int(t) for t in rng.integers(10, ref.VOCAB, n)] for n in (3, 17, 9, 30)]
    sampler = Sampler(model)
    free = sampler.generate(rows, SamplingParams(max_new_tokens=NEW)).tokens
    assert np.isin(free, banned).any(), "the random model must draw a vision placeholder for this test to bite"
    greedy = sampler.generate(rows, SamplingParams(max_new_tokens=NEW, suppress_token_ids=banned))
    assert not np.isin(greedy.tokens, banned).any() and np.isfinite(greedy.logprobs).all()
    for got, want in zip(greedy.tokens, free):  # the same argmax wherever the free run drew an allowed token
        first = int(np.argmax(np.isin(want, banned))) if np.isin(want, banned).any() else NEW
        np.testing.assert_array_equal(got[:first], want[:first])
    sampled = sampler.generate_groups(rows, 4, SamplingParams(max_new_tokens=NEW, temperature=1.0,
                                                              suppress_token_ids=banned), seed=3)
    assert not np.isin(sampled.tokens, banned).any()
    with pytest.raises(ValueError, match="suppress_token_ids"):
        SamplingParams(suppress_token_ids=(-1,))


def test_bad_sampling_params_are_named():
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=0)
    with pytest.raises(ValueError, match="max_new_tokens"):
        SamplingParams(max_new_tokens=0)


def test_greedy_token_is_the_first_argmax_with_its_log_softmax():
    rng = np.random.default_rng(5)
    logits = rng.standard_normal((6, 300)).astype(np.float32)
    logits[1, [7, 90, 200]] = 9.0   # a three-way tie: the first index wins, as in argmax
    logits[2] = 0.5                 # a flat row
    logits[3, 299] = 40.0           # the last index
    tok, lp = sample_token(jnp.asarray(logits), None, 0.0, 1.0, 0, mode=(True, False, False))
    np.testing.assert_array_equal(np.asarray(tok), np.argmax(logits, axis=-1))
    assert int(tok[1]) == 7 and int(tok[2]) == 0 and int(tok[3]) == 299
    want = np.asarray(jax.nn.log_softmax(jnp.asarray(logits), axis=-1))[np.arange(6), np.argmax(logits, axis=-1)]
    np.testing.assert_allclose(np.asarray(lp), want, atol=1e-6)


@pytest.mark.parametrize("mode", [(False, False, False), (False, True, True), None])
def test_sampled_tokens_are_jax_categoricals_for_the_same_keys(mode):
    """The draw is jax.random.categorical's (Gumbel noise + logits, first index of the max), per-row keys and one
    key; ties, suppressed (-inf) tokens and a temperature other than 1 included."""
    rng = np.random.default_rng(11)
    logits = rng.standard_normal((64, 257)).astype(np.float32) * 3
    logits[:, [3, 100]] = -np.inf  # suppressed
    logits[5] = 0.25                # a flat row: every index ties before the noise
    logits = jnp.asarray(logits)
    row_keys_ = jax.random.split(jax.random.key(4), 64)
    temperature, top_p, top_k = jnp.float32(0.7), jnp.float32(1.0), jnp.int32(0)
    tok, lp = sample_token(logits, row_keys_, temperature, top_p, top_k, mode=mode)
    want = jax.vmap(jax.random.categorical)(row_keys_, logits / 0.7)
    np.testing.assert_array_equal(np.asarray(tok), np.asarray(want))
    np.testing.assert_allclose(np.asarray(lp), np.asarray(jax.nn.log_softmax(logits / 0.7))[np.arange(64), want],
                               atol=1e-6)
    assert not np.isin(np.asarray(tok), [3, 100]).any()
    one, _ = sample_token(logits, jax.random.key(9), temperature, top_p, top_k, mode=mode)
    np.testing.assert_array_equal(np.asarray(one), np.asarray(jax.random.categorical(jax.random.key(9),
                                                                                     logits / 0.7, axis=-1)))


@pytest.mark.parametrize("layout", ["per_layer", "stacked"])
def test_updated_parameters_reach_every_decode_step(checkpoint, layout):
    _, d = checkpoint
    model = params.from_hf(d, runtime=RuntimeOptions(decode_layout=layout))
    sampler = Sampler(model)
    rows = [[11, 12, 13], [40, 41]]
    before = sampler.generate(rows, SamplingParams(max_new_tokens=4))
    assert (before.tokens != 0).any()
    model.text.lm_head[...] = jnp.zeros_like(model.text.lm_head[...])  # every logit equal: greedy picks id 0
    after = sampler.generate(rows, SamplingParams(max_new_tokens=4))
    assert (after.tokens == 0).all() and (after.lengths == 4).all(), after.tokens
    np.testing.assert_allclose(after.logprobs, -np.log(ref.VOCAB), rtol=1e-5)
