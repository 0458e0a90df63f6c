"""Scanned layers: the compiled program does not grow with depth; every remat policy and the unscanned
layer loop give the same gradients; the loop decodes like the scan."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rmsweb_jax.models.qwen3_vl import RuntimeOptions, abstract_model, create, prepare_inputs, tiny


def _hlo_size(num_layers: int) -> int:
    cfg = tiny(num_hidden_layers=num_layers)
    graphdef, state = nnx.split(abstract_model(cfg))
    ids = np.ones((2, 16), np.int32)
    inputs = prepare_inputs(cfg, ids)

    def forward(state, inputs):
        model = nnx.merge(graphdef, state)
        return model.logits(model.hidden_states(inputs)[0])

    return len(jax.jit(forward).lower(state, inputs).as_text())


def test_program_size_does_not_grow_with_depth():
    small, deep = _hlo_size(2), _hlo_size(12)
    assert deep <= small * 1.02, (small, deep)


@pytest.fixture(scope="module")
def remat_case():
    cfg = tiny(num_hidden_layers=2)
    _, state = nnx.split(create(cfg, seed=3))
    rng = np.random.default_rng(0)
    ids = rng.integers(10, 400, (2, 12)).astype(np.int32)
    ids[:, 2:4] = cfg.image_token_id  # one 2-token image per row
    pixels = rng.standard_normal((16, cfg.vision.patch_dim)).astype(np.float32)
    inputs = prepare_inputs(cfg, ids, pixel_values=pixels, image_grid_thw=np.array([[1, 4, 2], [1, 2, 4]]))

    def grads(runtime):
        graphdef, _ = nnx.split(abstract_model(cfg, runtime))  # same parameters, other runtime options

        def loss(state):
            model = nnx.merge(graphdef, state)
            return jnp.mean(model.logits(model.hidden_states(inputs)[0]) ** 2)

        return jax.jit(jax.grad(loss))(state)

    return grads, grads(RuntimeOptions())


@pytest.mark.parametrize("policy", ["full", "dots", "save_attention_out"])
def test_remat_policies_give_the_same_gradients(remat_case, policy):
    grads, want = remat_case
    got = grads(dataclasses.replace(RuntimeOptions(), remat_policy=policy))
    for a, b in zip(jax.tree.leaves(want), jax.tree.leaves(got)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("policy", ["none", "full"])
def test_layer_loop_gives_the_scans_gradients(remat_case, policy):
    grads, want = remat_case
    got = grads(RuntimeOptions(scan_layers=False, remat_policy=policy))
    for a, b in zip(jax.tree.leaves(want), jax.tree.leaves(got)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


def test_layer_loop_decodes_like_the_scan():
    from rmsweb_jax.sampling.sampler import Sampler, SamplingParams
    cfg = tiny(num_hidden_layers=3)
    _, state = nnx.split(create(cfg, seed=5))
    prompts = [[11, 12, 13, 14, 15], [21, 22, 23]]
    out = {}
    for scan in (True, False):
        graphdef, _ = nnx.split(abstract_model(cfg, RuntimeOptions(scan_layers=scan)))
        model = nnx.merge(graphdef, state)
        result = Sampler(model, length_buckets=(8,)).generate(prompts, SamplingParams(max_new_tokens=6))
        out[scan] = (np.asarray(result.tokens), np.asarray(result.logprobs))
    np.testing.assert_array_equal(out[True][0], out[False][0])
    np.testing.assert_allclose(out[True][1], out[False][1], rtol=1e-5, atol=1e-6)


def test_unknown_remat_policy_and_bad_scan_layers_are_named():
    with pytest.raises(ValueError, match="remat_policy"):
        RuntimeOptions(remat_policy="sometimes")
    with pytest.raises(ValueError, match="scan_layers"):
        RuntimeOptions(scan_layers="no")
