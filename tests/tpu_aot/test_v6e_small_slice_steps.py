"""The SFT training step compiled for a v6e slice of 4 chips (mesh (1, 2, 2)) at 8B widths: it compiles within 15%
of the planner's figure, and runs splash under shard_map with the LM head gathered once. The v5p slice's steps
(SFT and Salvage-DS) are in test_v5p_small_slice_steps.py, which says why Salvage-DS's step is compiled there only."""
import pytest

from tests.tpu_aot.slices import CompiledSlice, assert_step_runs_splash_and_gathers_the_head_once, assert_within_plan

pytestmark = [pytest.mark.tpu_aot, pytest.mark.slow]


@pytest.fixture(scope="module")
def small_slice():
    return CompiledSlice("8b", "v6e", 4, (1, 2, 2))


def test_the_sft_step_compiles_within_the_plan(small_slice):
    assert_within_plan(small_slice, "sft_step")


def test_the_step_runs_splash_and_gathers_the_lm_head_once(small_slice):
    assert_step_runs_splash_and_gathers_the_head_once(small_slice)
