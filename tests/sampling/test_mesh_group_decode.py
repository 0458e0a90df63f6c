"""Group decoding on a (1, 8, 1) mesh of 8 host CPU devices, the shape whose mining program deadlocked.

The mine stage's replay (4 prompts x G = 2, 1024-token prompt bucket) hung there with cascade decoding: the
collectives that move next_pos and rope_deltas from the P prompt rows to the P*G decode rows (collective-permutes,
an all-reduce within pairs of devices) depended on the inputs only, not on the prefill's layer loop, and XLA:CPU
ran them in another order on each device than the loop's weight all-gather over all 8 (one device waiting in the
pair's all-reduce, its partner in the all-gather). The sampler now places those host arrays whole on every device
and repeats them there: no collective left to run beside the loop. The structural test reads the compiled program:
no collective outside a loop that holds collectives may be unordered against it (it fails at once, where the
deadlock needs a 2-core machine's timing); the run test is the mine stage's call itself, under a timeout.
"""
import jax
import numpy as np
import pytest
from flax import nnx

from rmsweb_jax.models import sharding
from rmsweb_jax.models.qwen3_vl import RuntimeOptions, create, tiny
from rmsweb_jax.plan.hlo import Instruction, called_computations, read_module
from rmsweb_jax.plan.hlo_work import COLLECTIVES
from rmsweb_jax.sampling.sampler import Sampler, SamplingParams

SETTINGS = SamplingParams(max_new_tokens=8, temperature=1.0, stop_token_ids=(402,))  # the mine stage's


def _prompts(lengths):
    rng = np.random.default_rng(3)
    return [[int(t) for t in rng.integers(30, 500, n)] for n in lengths]


def _collective(inst: Instruction) -> bool:
    return inst.opcode.removesuffix("-start") in COLLECTIVES


def unordered_collectives(hlo: str) -> list[tuple[str, str]]:
    """Returns the pairs (instruction, loop) of the entry computation where `loop` is a control-flow instruction
    holding collectives, the instruction issues or holds collectives, and neither depends on the other."""
    module = read_module(hlo)
    comps = module.computations

    def holds(comp, seen=()):
        return any(_collective(i) or any(c not in seen and holds(c, (*seen, comp)) for c in called_computations(i))
                   for i in comps.get(comp, ()))

    insts = {i.name: i for i in comps[module.entry]}
    operands = {name: set(i.operands) & insts.keys() - {name} for name, i in insts.items()}
    ancestors: dict[str, set[str]] = {}

    def above(name):
        if name not in ancestors:
            ancestors[name] = set()
            for op in operands[name]:
                ancestors[name] |= {op} | above(op)
        return ancestors[name]

    bearing = {n for n, i in insts.items() if _collective(i) or any(holds(c) for c in called_computations(i))}
    loops = {n for n in bearing if insts[n].opcode in ("while", "conditional", "call")}
    return sorted((n, loop) for loop in loops for n in bearing - {loop}
                  if n not in above(loop) and loop not in above(n))


@pytest.fixture(scope="module")
def models():
    """Returns (a tiny model on one device, the same weights on the (1, 8, 1) mesh)."""
    single = create(tiny())
    on_mesh = create(tiny(), mesh=sharding.make_mesh((1, 8, 1)))
    assert on_mesh.runtime.group_decode == "cascade"  # the default, on a mesh too
    nnx.update(on_mesh, jax.tree.map(lambda x, y: jax.device_put(x, y.sharding), nnx.state(single),
                                     nnx.state(on_mesh)))
    return single, on_mesh


@pytest.mark.parametrize("group_decode", ["cascade", "copy"])
def test_no_collective_of_the_group_program_is_unordered_against_the_prefill_loop(group_decode):
    model = create(tiny(), mesh=sharding.make_mesh((1, 8, 1)), runtime=RuntimeOptions(group_decode=group_decode))
    hlo = Sampler(model).program(_prompts((30, 20, 25, 9)), 2, SETTINGS).lower().compile().as_text()
    assert "while(" in hlo and "all-gather(" in hlo  # the prefill's layer loop gathers fsdp weights
    assert unordered_collectives(hlo) == []


def test_the_check_finds_a_collective_beside_a_loop():
    hlo = """HloModule m

%body (p: f32[8]) -> f32[8] {
  %p = f32[8] parameter(0)
  ROOT %g = f32[8] all-gather(%p), channel_id=1
}

ENTRY %main (a: f32[8], b: s32[1]) -> (f32[8], s32[1]) {
  %a = f32[8] parameter(0)
  %b = s32[1] parameter(1)
  %w = f32[8] while(%a), condition=%cond, body=%body
  %r = s32[1] all-reduce(%b), channel_id=2, replica_groups={{0,1}}
  %after = f32[8] all-reduce(%w), channel_id=3
  ROOT %t = (f32[8], s32[1]) tuple(%after, %r)
}
"""
    assert unordered_collectives(hlo) == [("r", "w")]


@pytest.mark.timeout(240)
def test_the_mine_stage_call_on_a_mesh_decodes_the_unsharded_tokens(models):
    """4 prompts x G = 2 in the 1024-token bucket with the mine stage's settings: the call that hung (XLA:CPU
    aborts a rendezvous stuck 40 s, so a deadlock fails here rather than hangs), equal to one device's tokens."""
    single, on_mesh = models
    prompts = _prompts((900, 700, 800, 950))
    grouped, plain = Sampler(on_mesh), Sampler(single)
    for seed in (0, 1):
        got = grouped.generate_groups(prompts, 2, SETTINGS, seed=seed)
        want = plain.generate([p for p in prompts for _ in range(2)], SETTINGS, seed=seed)
        np.testing.assert_array_equal(got.tokens, want.tokens)
        np.testing.assert_allclose(got.logprobs, want.logprobs, atol=1e-4)
