"""Shared-prefix group sampling: each prompt prefilled once, G samples decoded from one copy of its cache
(cascade attention; group_decode "copy": from G copies of it).

The oracle is the plain sampler on the repeated prompt list (`generate([p0]*G + [p1]*G + ...)`, images
repeated per copy, same seed). Tokens, lengths and stop flags must be identical; log-probs agree to
1e-6 (absolute + relative, a few float32 ulps): the prefill runs on P rows instead of P*G, and XLA's
GEMMs sum in a batch-size-dependent order (measured: at most 9.5e-7 on log-probs of magnitude 1-12).
"""
import numpy as np
import pytest
from jax.extend import core as jax_core

from rmsweb_jax.models.qwen3_vl import params
from rmsweb_jax.models.qwen3_vl.config import RuntimeOptions
from rmsweb_jax.sampling import sampler as sampler_module
from rmsweb_jax.sampling.sampler import Sampler, SamplingParams
from tests.models import hf_reference as ref
from tests.sampling.server_http import png_url
from tests.sampling.tiny_chat import tiny_chat_model

G = 3
STOPS = tuple(range(10, 30))  # ~4% of the vocabulary: some rows stop early, most run to the end
KNOBS = {
    "plain": SamplingParams(max_new_tokens=10, temperature=1.0, stop_token_ids=STOPS),
    "top_k_top_p": SamplingParams(max_new_tokens=10, temperature=0.7, top_k=40, top_p=0.9, stop_token_ids=STOPS),
}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    d = tmp_path_factory.mktemp("qwen3vl_groups")
    ref.write_checkpoint(d, seed=17)
    return d


@pytest.fixture(scope="module", params=["per_layer", "stacked"])
def sampler(request, checkpoint):
    """A sampler over each decode layout (models/qwen3_vl/decode.py)."""
    return Sampler(params.from_hf(checkpoint, runtime=RuntimeOptions(decode_layout=request.param)), patch_bucket=64)


def _repeated(prompts, group_size):
    return [p for p in prompts for _ in range(group_size)]


def _assert_same_samples(got, want):
    np.testing.assert_array_equal(got.tokens, want.tokens)
    np.testing.assert_array_equal(got.lengths, want.lengths)
    np.testing.assert_array_equal(got.finished, want.finished)
    np.testing.assert_allclose(got.logprobs, want.logprobs, rtol=1e-6, atol=1e-6)


def _text_prompts(seed, lengths=(3, 17, 9)):
    rng = np.random.default_rng(seed)
    return [[int(t) for t in rng.integers(30, ref.VOCAB, n)] for n in lengths]


@pytest.mark.parametrize("knobs", KNOBS)
def test_groups_equal_repeated_prompts(sampler, knobs):
    prompts = _text_prompts(1)
    sp = KNOBS[knobs]
    got = sampler.generate_groups(prompts, G, sp, seed=11)
    want = sampler.generate(_repeated(prompts, G), sp, seed=11)
    _assert_same_samples(got, want)
    assert got.tokens.shape == (len(prompts) * G, sp.max_new_tokens)
    assert got.finished.any() and not got.finished.all()  # the stop handling is exercised both ways
    for p in range(len(prompts)):  # the copies of a prompt draw different samples (their own keys)
        rows = got.tokens[p * G:(p + 1) * G]
        assert len({tuple(r) for r in rows}) > 1, rows


def test_groups_with_images_equal_repeated_prompts(sampler):
    rng = np.random.default_rng(2)
    grids = [[1, 4, 6], [1, 8, 4]]
    (first, third), pixels = ref.image_prompt(rng, grids, texts_before=(2, 9), texts_after=(5, 1))
    prompts = [first, _text_prompts(3, (6,))[0], third]  # ragged, and the middle one has no image
    own = np.split(pixels, [int(np.prod(grids[0]))])
    repeated_pixels = np.concatenate([own[0]] * G + [own[1]] * G)
    repeated_grids = np.array([grids[0]] * G + [grids[1]] * G)
    sp = KNOBS["plain"]
    got = sampler.generate_groups(prompts, G, sp, pixel_values=pixels, image_grid_thw=np.array(grids), seed=4)
    want = sampler.generate(_repeated(prompts, G), sp, pixel_values=repeated_pixels, image_grid_thw=repeated_grids,
                            seed=4)
    _assert_same_samples(got, want)


def test_group_of_one_is_generate(sampler):
    prompts = _text_prompts(5)
    sp = KNOBS["top_k_top_p"]
    got, want = sampler.generate_groups(prompts, 1, sp, seed=3), sampler.generate(prompts, sp, seed=3)
    for a, b in zip(got, want):  # one program: bit for bit
        np.testing.assert_array_equal(a, b)


@pytest.mark.slow  # ~25 s: two programs compile
def test_copy_group_decode_equals_repeated_prompts(checkpoint):
    """The old path, kept as group_decode "copy" for the bench's comparison, keeps the same contract."""
    runtime = RuntimeOptions(decode_layout="per_layer", group_decode="copy")
    sampler = Sampler(params.from_hf(checkpoint, runtime=runtime), patch_bucket=64)
    prompts, sp = _text_prompts(12), KNOBS["plain"]
    got = sampler.generate_groups(prompts, G, sp, seed=5)
    _assert_same_samples(got, sampler.generate(_repeated(prompts, G), sp, seed=5))
    assert got.finished.any() and not got.finished.all()


@pytest.mark.parametrize("layout", ["per_layer", "stacked"])
def test_compacting_finished_rows_changes_no_sample_and_cuts_the_row_steps(checkpoint, layout):
    """model.decode_compaction drops finished rows as the loop goes (phases of halving width, within each group
    under cascade). Every row draws with its own key, so the samples are the uncompacted loop's; the loop runs
    fewer row-steps, and never fewer than the live rows' own."""
    prompts = _text_prompts(4, (5, 11, 8, 3))
    sp = SamplingParams(max_new_tokens=16, temperature=1.0, stop_token_ids=tuple(range(10, 90)))  # ~16%: short rows
    def run(compaction):
        runtime = RuntimeOptions(decode_layout=layout, decode_compaction=compaction)
        s = Sampler(params.from_hf(checkpoint, runtime=runtime))
        return s.generate_groups(prompts, 4, sp, seed=5), s.generate(prompts * 2, sp, seed=5)
    kept, compacted, deeper = run(0), run(2), run(3)
    for want, got in zip(kept, compacted):
        _assert_same_samples(got, want)
    for want, got in zip(kept, deeper):
        _assert_same_samples(got, want)
    for out in kept:  # the uncompacted loop runs every row until the last one stops
        assert out.row_steps == out.lengths.size * (out.lengths.max() - 1)
        assert (out.lengths < out.lengths.max()).sum() > out.lengths.size // 2  # most rows finish early: phases end
    for full, fewer in zip(kept, compacted):
        live = int((fewer.lengths - 1).sum())  # the steps each row still had to decode
        assert live <= fewer.row_steps < full.row_steps, (live, fewer.row_steps, full.row_steps)


def _while_operands(jaxpr) -> list[tuple[int, ...]]:
    """Returns the shapes of every operand of every while loop in `jaxpr` (nested jaxprs included)."""
    found = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "while":
            found += [tuple(v.aval.shape) for v in eqn.invars]
        for value in eqn.params.values():
            for sub in value if isinstance(value, (tuple, list)) else (value,):
                if isinstance(sub, jax_core.ClosedJaxpr):
                    found += _while_operands(sub.jaxpr)
                elif isinstance(sub, jax_core.Jaxpr):
                    found += _while_operands(sub)
    return found


@pytest.mark.parametrize("layout", ["per_layer", "stacked"])
def test_grouped_rows_never_hold_copies_of_the_prompt_cache(checkpoint, layout):
    """The decode loop's KV buffers: one prompt cache of P rows and P*G rows of max_new slots (cascade), where
    the copy path holds P*G rows of prompt + max_new slots. Read from the traced program (nothing compiles)."""
    cfg = ref.hf_config()
    kvh, hd = cfg.text_config.num_key_value_heads, cfg.text_config.head_dim
    prompts, group, sp = _text_prompts(13, (20, 7)), 4, SamplingParams(max_new_tokens=5, temperature=1.0)
    bucket = 32  # the prompts' length bucket

    def kv_buffers(group_decode):  # (rows, slots) of every KV buffer the decode loops carry
        runtime = RuntimeOptions(decode_layout=layout, group_decode=group_decode)
        jaxpr = Sampler(params.from_hf(checkpoint, runtime=runtime)).program(prompts, group, sp).jaxpr.jaxpr
        shapes = _while_operands(jaxpr)
        per_layer = {(s[0], s[2]) for s in shapes if len(s) == 4 and (s[1], s[3]) == (kvh, hd)}  # [B, KVH, S, hd]
        stacked = {(s[1], s[2]) for s in shapes if len(s) == 5 and s[3:] == (kvh, hd)}          # [L, B, S, KVH, hd]
        return per_layer | stacked

    rows = len(prompts) * group
    # model.decode_compaction = 2 (the default): the loop's phases run on G, G/2 and G/4 rows of each group (cascade),
    # on all rows, half and a quarter of them (copy); every phase's rows of cascade hold their own slots only
    assert RuntimeOptions().decode_compaction == 2
    assert kv_buffers("cascade") == {(len(prompts), bucket)} | {(len(prompts) * g, sp.max_new_tokens)
                                                                 for g in (group, group // 2, group // 4)}
    assert kv_buffers("copy") == {(r, bucket + sp.max_new_tokens) for r in (rows, rows // 2, rows // 4)}


def _dot_rows(jaxpr) -> list[tuple[int, int]]:
    """Returns (rows, contracted size) of every dot_general outside while loops (the prefill, not decode
    steps), rows being the product of the left operand's non-contracted dimensions."""
    found = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "dot_general":
            shape = eqn.invars[0].aval.shape
            contracted = eqn.params["dimension_numbers"][0][0]
            found.append((int(np.prod([n for i, n in enumerate(shape) if i not in contracted])),
                          int(np.prod([shape[i] for i in contracted]))))
        if eqn.primitive.name == "while":
            continue
        for value in eqn.params.values():
            for sub in value if isinstance(value, (tuple, list)) else (value,):
                if isinstance(sub, jax_core.ClosedJaxpr):
                    found += _dot_rows(sub.jaxpr)
                elif isinstance(sub, jax_core.Jaxpr):
                    found += _dot_rows(sub)
    return found


def test_prefill_and_vision_run_once_per_prompt(checkpoint):
    sampler = Sampler(params.from_hf(checkpoint), patch_bucket=64)
    rng = np.random.default_rng(6)
    grids = [[1, 8, 8], [1, 8, 8]]
    prompts, pixels = ref.image_prompt(rng, grids, texts_before=(40, 30), texts_after=(20, 5))
    patch_dim = pixels.shape[1]
    sp = SamplingParams(max_new_tokens=4, temperature=1.0)

    def rows(prompts, group_size, pixels, grids):
        traced = sampler.program(prompts, group_size, sp, pixel_values=pixels, image_grid_thw=np.array(grids))
        dots = _dot_rows(traced.jaxpr.jaxpr)
        return max(r for r, _ in dots), max(r for r, k in dots if k == patch_dim)  # (largest, patch embedding)

    grouped = rows(prompts, 4, pixels, grids)
    once = rows(prompts, 1, pixels, grids)
    repeated = rows(_repeated(prompts, 4), 1, np.concatenate([pixels[:64]] * 4 + [pixels[64:]] * 4), [grids[0]] * 8)
    # 2 prompts of a 128-token bucket: the prefill's largest product has 2 * 128 token rows (times the
    # attention heads), and the vision tower embeds 128 patches; the repeated list has 4x of each.
    assert grouped == once, (grouped, once)
    assert grouped[1] == 128 and repeated[1] == 4 * 128, (grouped, repeated)
    assert repeated[0] == 4 * grouped[0], (grouped, repeated)


def test_one_compile_per_shape(checkpoint):
    sampler = Sampler(params.from_hf(checkpoint, runtime=RuntimeOptions(decode_layout="stacked")))
    sp = SamplingParams(max_new_tokens=3, temperature=1.0)
    sampler.generate_groups(_text_prompts(7, (5, 9)), 2, sp, seed=0)
    compiled = sampler_module._generate._cache_size()
    # Other prompts in the same bucket, another seed: the same program.
    sampler.generate_groups(_text_prompts(8, (12, 2)), 2, sp, seed=9)
    assert sampler_module._generate._cache_size() == compiled
    sampler.generate_groups(_text_prompts(8, (12, 2)), 4, sp, seed=9)  # another group size: one more
    assert sampler_module._generate._cache_size() == compiled + 1


@pytest.mark.parametrize("group_size, match", [(0, "group_size must be an int >= 1, got 0"), (-2, "got -2"),
                                               (1.5, "got 1.5"), (True, "got True")])
def test_bad_group_size_is_named(checkpoint, group_size, match):
    sampler = Sampler(params.from_hf(checkpoint, runtime=RuntimeOptions(decode_layout="stacked")))
    with pytest.raises(ValueError, match=match):
        sampler.generate_groups([[1, 2, 3]], group_size)


def test_empty_prompts_are_named(checkpoint):
    sampler = Sampler(params.from_hf(checkpoint, runtime=RuntimeOptions(decode_layout="stacked")))
    with pytest.raises(ValueError, match="got no prompts"):
        sampler.generate_groups([], 2)
    with pytest.raises(ValueError, match=r"prompts \[1\] are empty"):
        sampler.generate_groups([[1, 2], [], [3]], 2)


def _conversation(text, image=False):
    content = [{"type": "text", "text": text}]
    if image:
        content.append({"type": "image_url", "image_url": {"url": png_url()}})
    return [{"role": "system", "content": "You are a web agent."}, {"role": "user", "content": content}]


def test_chat_model_groups_equal_complete_on_repeated_conversations():
    chat = tiny_chat_model()  # max_batch 4: groups of 2 take 2 conversations a call, like complete's 4 rows
    conversations = [_conversation("Click the second button, then stop.", image=True),
                     _conversation("Type hello."), _conversation("Open the menu and pick the third entry please.")]
    sp = SamplingParams(max_new_tokens=8, temperature=1.0)
    groups = chat.sample_groups(conversations, 2, sp, seed=21)
    flat = chat.complete(_repeated(conversations, 2), sp, seed=21)
    assert [len(g) for g in groups] == [2, 2, 2]
    for got, want in zip([c for g in groups for c in g], flat):
        assert (got.token_ids, got.text, got.finish_reason) == (want.token_ids, want.text, want.finish_reason)
        assert got.prompt_tokens == want.prompt_tokens and got.completion_tokens == len(got.token_ids)
        np.testing.assert_allclose(got.logprobs, want.logprobs, rtol=1e-6, atol=1e-6)
    assert groups[0][0].token_ids != groups[0][1].token_ids
    with pytest.raises(ValueError, match="group_size must be an int >= 1, got 0"):
        chat.sample_groups(conversations, 0, sp)
