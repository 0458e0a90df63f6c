"""Every program of sft, mine and salvage compiled for a v5p slice of 4 chips (mesh (1, 2, 2)) at 8B widths: it
compiles, its per-device peak is within 15% of the planner's figure, the sampler's decode loop gathers no
weights, and the step runs splash under shard_map with the LM head gathered once."""
import pytest

from tests.tpu_aot.slices import (CompiledSlice, assert_decode_reads_local_weights,
                                  assert_step_runs_splash_and_gathers_the_head_once, assert_within_plan)

pytestmark = [pytest.mark.tpu_aot, pytest.mark.slow]
PROGRAMS = ("sft_step", "salvage_step", "mine_logprobs", "mine_generate", "salvage_generate")


@pytest.fixture(scope="module")
def v5p():
    return CompiledSlice("8b", "v5p", 4, (1, 2, 2))


@pytest.mark.parametrize("program", PROGRAMS)
def test_program_compiles_within_the_plan(v5p, program):
    assert_within_plan(v5p, program)


def test_the_decode_loop_reads_local_weights_only(v5p):
    assert_decode_reads_local_weights(v5p)


def test_the_step_runs_splash_and_gathers_the_lm_head_once(v5p):
    assert_step_runs_splash_and_gathers_the_head_once(v5p)
