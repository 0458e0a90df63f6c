"""Sharded Qwen3-VL on 8 host CPU devices gives the unsharded logits (and sampled tokens), with parameters
really sharded."""
import jax
import numpy as np
import pytest
from flax import nnx

from rmsweb_jax.models import sharding
from rmsweb_jax.models.qwen3_vl import RuntimeOptions, create, params, tiny
from rmsweb_jax.sampling.sampler import Sampler, SamplingParams
from tests.models import hf_reference as ref


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    d = tmp_path_factory.mktemp("qwen3vl_shard")
    ref.write_checkpoint(d, seed=11)
    rng = np.random.default_rng(11)
    grids = [[1, 4, 6], [1, 8, 4]]
    rows, pixels = ref.image_prompt(rng, grids)
    ids, mask = ref.left_pad(rows)
    inputs = dict(attention_mask=mask, pixel_values=pixels, image_grid_thw=np.array(grids))
    expected = np.asarray(params.from_hf(d)(ids, **inputs).logits)
    return d, ids, inputs, expected


def _sharded_fraction(model) -> float:
    """Returns the fraction of parameter elements a single device holds (1.0 = fully replicated)."""
    held = total = 0
    for _, var in nnx.to_flat_state(nnx.state(model, nnx.Param)):
        arr = var[...]
        total += arr.size
        held += arr.addressable_shards[0].data.size
    return held / total


@pytest.mark.parametrize("shape", [(1, 8, 1), (1, 2, 4), (2, 2, 2)])
def test_sharded_logits_match_unsharded(checkpoint, shape):
    assert len(jax.devices()) == 8, "tests/conftest.py must give 8 host devices"
    d, ids, inputs, expected = checkpoint
    mesh = sharding.make_mesh(shape)
    model = params.from_hf(d, mesh=mesh)
    q = model.text.q_kernel[...]
    spec = q.sharding.spec
    if shape[1] > 1:
        assert "fsdp" in jax.tree.leaves(tuple(spec)), spec
    if shape[2] > 1:
        assert "tensor" in jax.tree.leaves(tuple(spec)), spec
    assert q.addressable_shards[0].data.size < q.size
    assert _sharded_fraction(model) < 0.6
    got = np.asarray(model(ids, **inputs).logits)
    mask = inputs["attention_mask"].astype(bool)
    assert float(np.abs(got - expected)[mask].max()) <= 1e-5


def test_create_places_parameters_sharded_without_a_full_copy():
    mesh = sharding.make_mesh((1, 2, 4))
    model = create(tiny(), mesh=mesh)
    gate = model.text.gate_kernel[...]
    assert gate.sharding.spec == sharding.logical_to_spec(("layers", "embed", "mlp"), mesh=mesh, shape=gate.shape)
    assert gate.addressable_shards[0].data.shape == (gate.shape[0], gate.shape[1] // 2, gate.shape[2] // 4)


def test_rules_table_from_config_is_validated():
    with pytest.raises(ValueError, match="unknown mesh axis 'model'"):
        sharding.rules_from_config([["embed", "model"]])
    rules = sharding.rules_from_config([["embed", ["data", "fsdp"]], ["mlp", None]])
    assert sharding.logical_to_spec(("embed", "mlp"), rules) == jax.sharding.PartitionSpec(("data", "fsdp"), None)


@pytest.mark.parametrize("layout", ["stacked", "per_layer"])
def test_sharded_sampler_decodes_the_unsharded_tokens(checkpoint, layout):
    d, ids, inputs, _ = checkpoint
    rows = [[int(t) for t, m in zip(r, mr) if m] for r, mr in zip(ids, inputs["attention_mask"])]
    image = dict(pixel_values=inputs["pixel_values"], image_grid_thw=inputs["image_grid_thw"])
    settings = SamplingParams(max_new_tokens=12)
    want = Sampler(params.from_hf(d), patch_bucket=64).generate(rows, settings, **image)
    mesh = sharding.make_mesh((1, 2, 4))
    model = params.from_hf(d, mesh=mesh, runtime=RuntimeOptions(decode_layout=layout))
    got = Sampler(model, patch_bucket=64).generate(rows, settings, **image)
    np.testing.assert_array_equal(got.tokens, want.tokens)
    np.testing.assert_allclose(got.logprobs, want.logprobs, atol=1e-4)


def test_sharded_group_sampling_decodes_the_unsharded_repeated_prompts(checkpoint):
    """Cascade group decoding on a (1, 2, 4) mesh: 3 prompts x G = 2 (6 rows over the 2 batch shards, the prompt
    cache's 3 rows not a multiple of them) draws the tokens of the unsharded sampler on the repeated prompts."""
    d = checkpoint[0]
    rng = np.random.default_rng(8)
    prompts = [[int(t) for t in rng.integers(30, ref.VOCAB, n)] for n in (5, 19, 11)]
    settings = SamplingParams(max_new_tokens=8, temperature=1.0)
    want = Sampler(params.from_hf(d)).generate([p for p in prompts for _ in range(2)], settings, seed=2)
    model = params.from_hf(d, mesh=sharding.make_mesh((1, 2, 4)),
                           runtime=RuntimeOptions(decode_layout="stacked"))
    assert model.runtime.group_decode == "cascade"
    got = Sampler(model).generate_groups(prompts, 2, settings, seed=2)
    np.testing.assert_array_equal(got.tokens, want.tokens)
    np.testing.assert_allclose(got.logprobs, want.logprobs, atol=1e-4)
