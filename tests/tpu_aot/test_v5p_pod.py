"""A v5p-64 pod slice (32 chips, mesh (1, 16, 2)) at 8B widths, as its preset lays it out: the SFT step and the mine
and salvage sampler calls compile within 15% of the plan, the step runs splash under shard_map with the LM head
gathered once, and the decode loop gathers no weights (at these shapes the two sampler calls are one program: the
second is jit's cache). (One file a slice: make test's two workers take whole files, so the pods' minutes of
compiles split between them.)"""
import pytest

from tests.tpu_aot.slices import (CompiledSlice, assert_decode_reads_local_weights,
                                  assert_step_runs_splash_and_gathers_the_head_once, assert_within_plan)

pytestmark = [pytest.mark.tpu_aot, pytest.mark.slow]


@pytest.fixture(scope="module")
def pod():
    return CompiledSlice("8b", "v5p", 32, (1, 16, 2))


@pytest.mark.parametrize("program", ("sft_step", "mine_generate", "salvage_generate"))
def test_program_compiles_within_the_plan(pod, program):
    assert_within_plan(pod, program)


def test_the_step_runs_splash_and_gathers_the_lm_head_once(pod):
    assert_step_runs_splash_and_gathers_the_head_once(pod)


def test_the_decode_loop_reads_local_weights_only(pod):
    assert_decode_reads_local_weights(pod)
