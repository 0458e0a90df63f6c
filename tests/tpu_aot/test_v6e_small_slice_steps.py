"""The SFT training step compiled for a v6e slice of 4 chips (mesh (1, 2, 2)) at 8B widths: it compiles within 15%
of the planner's figure, runs splash under shard_map with the LM head gathered once (a check that fails when one
more gather follows a kernel in the layer loop), and its work read from the HLO counts every loop's trips. The v5p
slice's steps (SFT and Salvage-DS) are in test_v5p_small_slice_steps.py, which says why Salvage-DS's step is
compiled there only."""
import pytest

from tests.tpu_aot.slices import (CompiledSlice, assert_gathers_the_head_once,
                                  assert_step_runs_splash_and_gathers_the_head_once,
                                  assert_step_work_counts_every_trip,
                                  assert_within_plan, lm_head_shard, plant_after_kernel, planted_gather)

pytestmark = [pytest.mark.tpu_aot, pytest.mark.slow]


@pytest.fixture(scope="module")
def small_slice():
    return CompiledSlice("8b", "v6e", 4, (1, 2, 2))


def test_the_sft_step_compiles_within_the_plan(small_slice):
    assert_within_plan(small_slice, "sft_step")


def test_the_step_runs_splash_and_gathers_the_lm_head_once(small_slice):
    assert_step_runs_splash_and_gathers_the_head_once(small_slice)


def test_the_head_check_sees_a_second_gather_planted_after_a_kernel(small_slice):
    head = lm_head_shard(small_slice)
    planted = plant_after_kernel(small_slice.report("sft_step").hlo, planted_gather(head))
    with pytest.raises(AssertionError, match="all-gathers of the LM head"):
        assert_gathers_the_head_once(planted, head)


def test_the_step_s_work_counts_every_loop_trip(small_slice):
    assert_step_work_counts_every_trip(small_slice)
