"""Sharded Qwen3-VL on 8 host CPU devices gives the unsharded logits (and sampled tokens), with parameters
really sharded."""
import dataclasses
import importlib

import jax
import numpy as np
import pytest
from flax import nnx

from rmsweb_jax.models import qwen3_vl, sharding
from rmsweb_jax.models.qwen3_vl import RuntimeOptions, create, params, tiny
from rmsweb_jax.plan import chips, memory, programs
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


def _preset_call(size: str, slice_name: str):
    """Returns (abstract mesh, chip, the salvage sampler call's DecodeWork) of a pod preset."""
    config = importlib.import_module(f"configs.qwen3_vl_{size}_salvage").get_config(slice_name)
    chip = chips.chip(config.plan.chip)
    mesh = memory.abstract_mesh(memory.mesh_shape(config.mesh.shape, chips.device_count(chip, config.plan.topology)))
    shapes = programs.sampling_shapes(config, "salvage")
    work = sharding.DecodeWork.of(qwen3_vl.preset(size).text, memory.dtype_bytes(config.model.compute_dtype),
                                  shapes.rows, memory.prompt_bucket(shapes.prompt_len), shapes.max_new_tokens,
                                  shapes.group_size, cascade=config.model.group_decode == "cascade")
    return mesh, chip, work


@pytest.mark.parametrize("size, slice_name", [("8b", "v5p"), ("8b", "v6e"), ("32b", "v5p"), ("32b", "v6e")])
def test_auto_decode_layout_on_the_presets_is_the_cheaper_step(size, slice_name):
    """On every pod preset the tensor layout reads fewer bytes a token than whole weights on every device (8B on
    v5p-64, mesh (1, 16, 2): 7.6 GB of weights against 15.1) and its 2 all-reduces a layer cost less than that."""
    mesh, chip, work = _preset_call(size, slice_name)
    costs = sharding.decode_costs(mesh, work, sharding.BANDWIDTHS[chip.name])
    figures = f"{size} on {chip.name} {dict(mesh.shape)}:\n" + "\n".join(map(str, costs.values()))
    got = sharding.pick_decode_sharding("auto", mesh, work.weight_bytes(1), chip.hbm_bytes, work=work, chip=chip.name)
    assert got == "tensor", figures
    assert costs["tensor"].read_bytes < costs["replicated"].read_bytes, figures
    assert costs["tensor"].seconds < costs["replicated"].seconds, figures
    # Whole weights split the rows over every device: none decodes a row another does.
    assert costs["replicated"].rows * mesh.size == work.rows, figures
    assert costs["tensor"].rows * mesh.size // mesh.shape["tensor"] == work.rows, figures


def test_auto_replicates_a_small_model_when_the_collectives_cost_more_than_the_weights():
    """The 8B v5p-64 call with the tiny model's widths: 2 all-reduces a layer take longer than reading the whole
    weights, and the copy fits a quarter of the HBM: replicated, its rows over all 32 devices."""
    mesh, chip, work = _preset_call("8b", "v5p")
    small = dataclasses.replace(work, **{k: getattr(tiny().text, n) for k, n in (
        ("layers", "num_hidden_layers"), ("hidden", "hidden_size"), ("heads", "num_attention_heads"),
        ("kv_heads", "num_key_value_heads"), ("head_dim", "head_dim"), ("mlp", "intermediate_size"),
        ("vocab", "vocab_size"))})
    costs = sharding.decode_costs(mesh, small, sharding.BANDWIDTHS[chip.name])
    figures = "\n".join(map(str, costs.values()))
    assert sharding.pick_decode_sharding("auto", mesh, small.weight_bytes(1), chip.hbm_bytes, work=small,
                                         chip=chip.name) == "replicated", figures
    assert costs["replicated"].rows == 2 and costs["replicated"].collectives == 0, figures
    # The same copy over a quarter of the HBM is never replicated, whatever it costs.
    assert sharding.pick_decode_sharding("auto", mesh, small.weight_bytes(1), 3 * small.weight_bytes(1), work=small,
                                         chip=chip.name) == "tensor"


def test_replicated_decode_rules_split_rows_over_every_axis_and_devices_name_their_chip():
    mesh = sharding.make_mesh((2, 2, 2))
    rules = sharding.decode_rules(sharding.DEFAULT_RULES, "replicated")
    assert sharding.logical_to_spec(("batch", "embed", "mlp"), rules, mesh, (8, 64, 64)) == \
        jax.sharding.PartitionSpec(("data", "fsdp", "tensor"), None, None)
    assert sharding.row_shards(mesh, sharding.decode_rules(sharding.DEFAULT_RULES, "tensor")) == 4
    kinds = {"TPU v5": "v5p", "TPU v5p": "v5p", "TPU v5 lite": "v5e", "TPU v6 lite": "v6e",
             "NVIDIA H100 80GB HBM3": "h100", "NVIDIA H200": "h200", "cpu": None}
    assert {k: sharding.chip_of(k) for k in kinds} == kinds


def test_auto_takes_no_decode_copy_on_a_mesh_without_fsdp():
    # A host's own rollout mesh (1, 1, 4): the weights already lie as 'tensor' would lay them.
    mesh, chip, work = _preset_call("32b", "v6e")
    host = sharding.make_mesh((1, 1, 4), devices=jax.devices()[:4])
    whole = work.weight_bytes(1)
    assert sharding.pick_decode_sharding("auto", host, whole, chip.hbm_bytes, work=work, chip=chip.name) == "training"
    assert sharding.pick_decode_sharding("tensor", host, whole, chip.hbm_bytes) == "tensor"  # asked for: kept
    assert sharding.pick_decode_sharding("auto", mesh, whole, chip.hbm_bytes, work=work, chip=chip.name) == "tensor"
    # No tensor axis either (one fsdp block): whole weights, rows over every device, as before.
    flat = sharding.make_mesh((1, 1, 4), axis_names=("data", "tensor", "fsdp"), devices=jax.devices()[:4])
    assert sharding.pick_decode_sharding("auto", flat, 1, None) == "replicated"
