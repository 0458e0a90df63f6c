"""A v5p-64 pod slice (32 chips, mesh (1, 16, 2)) at 8B widths, as its preset lays it out: the SFT step and the mine
and salvage sampler calls compile within 15% of the plan, the step runs splash under shard_map with the LM head
gathered once, its work read from the HLO counts every loop's trips, and the decode loop gathers no weights (at these
shapes the two sampler calls are one program: the second is jit's cache); both gather checks fail when one more
gather follows a kernel call. (One file a slice: make test's two workers take whole files, so the pods' minutes of
compiles split between them.)"""
import pytest

from rmsweb_jax.sampling.sampler import DECODE_LOOP_SCOPE
from tests.tpu_aot.slices import (CompiledSlice, assert_decode_reads_local_weights, assert_gathers_the_head_once,
                                  assert_loop_gathers_no_weights, assert_step_runs_splash_and_gathers_the_head_once,
                                  assert_step_work_counts_every_trip, assert_within_plan, lm_head_shard,
                                  plant_after_kernel, planted_gather)

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


def test_the_step_s_work_counts_every_loop_trip(pod):
    assert_step_work_counts_every_trip(pod)


def test_the_checks_see_a_gather_planted_after_a_kernel(pod):
    """The two checks above fail on their own programs with one more weight gather after a multi-line kernel call:
    a second LM-head gather in the layer loop, a 96 MiB gather in the decode loop."""
    head = lm_head_shard(pod)
    with pytest.raises(AssertionError, match="all-gathers of the LM head"):
        assert_gathers_the_head_once(plant_after_kernel(pod.report("sft_step").hlo, planted_gather(head)), head)
    decode = plant_after_kernel(pod.report("mine_generate").hlo, planted_gather("[4096,12288]"),
                                scope=DECODE_LOOP_SCOPE)
    with pytest.raises(AssertionError, match="loop all-gathers 1 weight-sized"):
        assert_loop_gathers_no_weights(decode, DECODE_LOOP_SCOPE)
