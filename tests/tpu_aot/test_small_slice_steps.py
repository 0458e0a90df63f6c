"""The training steps of sft and salvage compiled for a v5p and a v6e slice of 4 chips (mesh (1, 2, 2)) at 8B widths:
each compiles within 15% of the planner's figure, and the step runs splash under shard_map with the LM head gathered
once. Mining's forward on the same slices: test_small_slice_forward.py (make test's two workers take whole files, so
the minutes of compiles split between them)."""
import pytest

from tests.tpu_aot.slices import CompiledSlice, assert_step_runs_splash_and_gathers_the_head_once, assert_within_plan

pytestmark = [pytest.mark.tpu_aot, pytest.mark.slow]


@pytest.fixture(scope="module", params=("v5p", "v6e"))
def small_slice(request):
    return CompiledSlice("8b", request.param, 4, (1, 2, 2))


@pytest.mark.parametrize("program", ("sft_step", "salvage_step"))
def test_program_compiles_within_the_plan(small_slice, program):
    assert_within_plan(small_slice, program)


def test_the_step_runs_splash_and_gathers_the_lm_head_once(small_slice):
    assert_step_runs_splash_and_gathers_the_head_once(small_slice)
