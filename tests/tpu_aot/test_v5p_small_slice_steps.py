"""The training steps of sft and salvage compiled for a v5p slice of 4 chips (mesh (1, 2, 2)) at 8B widths: each
compiles within 15% of the planner's figure, and the step runs splash under shard_map with the LM head gathered
once. The v6e slice's step: test_v6e_small_slice_steps.py; mining's forward on both slices:
test_small_slice_forward.py. One file a slice, because make test's workers take whole files: the minutes of
compiles of the two slices run on two workers, not one after the other on one.

Salvage's step is compiled on the v5p slice only: on v6e it is the SFT step's program with the RL loss (the same GiB
to three digits in BUILD.md's table), and at 387 s of CPU it was the longest of make test's compiles left to run
after the rest of the suite. The demo's salvage step also compiles for v5p in test_plan_compile_cli.py."""
import pytest

from tests.tpu_aot.slices import CompiledSlice, assert_step_runs_splash_and_gathers_the_head_once, assert_within_plan

pytestmark = [pytest.mark.tpu_aot, pytest.mark.slow]


@pytest.fixture(scope="module")
def small_slice():
    return CompiledSlice("8b", "v5p", 4, (1, 2, 2))


@pytest.mark.parametrize("program", ("sft_step", "salvage_step"))
def test_program_compiles_within_the_plan(small_slice, program):
    assert_within_plan(small_slice, program)


def test_the_step_runs_splash_and_gathers_the_lm_head_once(small_slice):
    assert_step_runs_splash_and_gathers_the_head_once(small_slice)
