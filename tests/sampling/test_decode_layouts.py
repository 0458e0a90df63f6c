"""The decode layouts on a (1, 4, 2) mesh of 8 host CPU devices (tensor 2): the replicated copy splits the decode
rows over every device, data x fsdp x tensor, so no two devices decode the same row, and every layout draws the
one-device sampler's tokens, rows that do not divide the devices included (they are padded)."""
import re

import jax
import numpy as np
import pytest
from flax import nnx

from rmsweb_jax.models import sharding
from rmsweb_jax.models.qwen3_vl import RuntimeOptions, create, tiny
from rmsweb_jax.plan.hlo import while_loop_closure
from rmsweb_jax.sampling.sampler import DECODE_LOOP_SCOPE, Sampler, SamplingParams

MESH = (1, 4, 2)
GREEDY = SamplingParams(max_new_tokens=8)
DRAWN = SamplingParams(max_new_tokens=8, temperature=1.0)


def _prompts(n, seed=5):
    rng = np.random.default_rng(seed)
    return [[int(t) for t in rng.integers(30, 500, length)] for length in rng.integers(4, 30, n)]


@pytest.fixture(scope="module")
def single():
    return create(tiny())


def _on_mesh(single, layout):
    """Returns the one-device model's weights on the (1, 4, 2) mesh, decoding in `layout`."""
    model = create(tiny(), mesh=sharding.make_mesh(MESH), runtime=RuntimeOptions(decode_sharding=layout))
    nnx.update(model, jax.tree.map(lambda x, y: jax.device_put(x, y.sharding), nnx.state(single), nnx.state(model)))
    return model


def test_the_replicated_rules_put_each_row_of_the_cache_on_one_device():
    mesh = sharding.make_mesh(MESH)
    rules = sharding.decode_rules(sharding.DEFAULT_RULES, "replicated")
    assert sharding.row_shards(mesh, rules) == 8
    cfg = tiny().text
    shape = (cfg.num_hidden_layers, 8, 40, cfg.num_key_value_heads, cfg.head_dim)
    cache = jax.device_put(np.zeros(shape, np.float32), sharding.named_sharding(
        mesh, ("layers", "batch", "kv_seq", "kv_heads", "head_dim"), rules, shape))
    rows = [s.index[1] for s in cache.addressable_shards]
    held = sorted(r for sl in rows for r in range(*sl.indices(8)))
    assert held == list(range(8)), f"rows held by the 8 devices: {rows}"
    tensor = sharding.decode_rules(sharding.DEFAULT_RULES, "tensor")
    assert sharding.row_shards(mesh, tensor) == 4  # tensor splits KV heads instead: rows over data x fsdp


def test_the_replicated_decode_loop_holds_one_row_a_device_and_draws_the_one_device_tokens(single):
    model = _on_mesh(single, "replicated")
    sampler, prompts = Sampler(model), _prompts(8)
    hlo = sampler.program(prompts, 1, GREEDY).lower().compile().as_text()
    cfg = model.config.text
    # The stacked KV cache in the loop, per device: [layers, rows, 32 + 8 slots, KV heads, head_dim].
    pattern = re.compile(rf"\[{cfg.num_hidden_layers},(\d+),40,{cfg.num_key_value_heads},{cfg.head_dim}\]")
    loop = "\n".join(line for body in while_loop_closure(hlo, DECODE_LOOP_SCOPE).values() for line in body)
    assert {int(r) for r in pattern.findall(loop)} == {1}, pattern.findall(loop)
    want = Sampler(single).generate(prompts, GREEDY)
    got = sampler.generate(prompts, GREEDY)
    np.testing.assert_array_equal(got.tokens, want.tokens)
    np.testing.assert_allclose(got.logprobs, want.logprobs, atol=1e-4)


@pytest.mark.parametrize("layout", ["replicated", "tensor"])
def test_rows_that_do_not_divide_the_devices_draw_the_one_device_tokens(single, layout):
    """3 prompts (padded to the row shards) and 3 prompts x G = 2 under cascade (padded by whole prompts)."""
    model = _on_mesh(single, layout)
    sampler, plain = Sampler(model), Sampler(single)
    prompts = _prompts(3, seed=7)
    got, want = sampler.generate(prompts, GREEDY), plain.generate(prompts, GREEDY)
    np.testing.assert_array_equal(got.tokens, want.tokens)
    got = sampler.generate_groups(prompts, 2, DRAWN, seed=4)
    want = plain.generate([p for p in prompts for _ in range(2)], DRAWN, seed=4)
    np.testing.assert_array_equal(got.tokens, want.tokens)
    np.testing.assert_allclose(got.logprobs, want.logprobs, atol=1e-4)
    assert got.tokens.shape == (6, DRAWN.max_new_tokens)


def test_auto_prices_the_first_call_and_keeps_its_layout(single):
    sampler = Sampler(_on_mesh(single, "auto"))
    assert sampler.decode_sharding is None  # priced at the first call
    sampler.generate(_prompts(2), GREEDY)
    costs = sampler.decode_costs
    cheaper = min(costs.values(), key=lambda c: c.seconds).layout
    assert sampler.decode_sharding == cheaper, "\n".join(map(str, costs.values()))
    # A tiny model's weights stream in microseconds: the tensor layout's collectives cost more than they save.
    assert sampler.decode_sharding == "replicated", "\n".join(map(str, costs.values()))
    sampler.generate(_prompts(5), GREEDY)
    assert sampler.decode_sharding == "replicated"
