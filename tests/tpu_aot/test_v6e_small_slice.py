"""The SFT step and the sampler compiled for a v6e slice of 4 chips (mesh (1, 2, 2)) at 8B widths, checked as on
v5p (test_v5p_small_slice.py, which also compiles the Salvage-DS step and mining's forward: each compile costs
minutes of the suite's 2 cores)."""
import pytest

from tests.tpu_aot.slices import (CompiledSlice, assert_decode_reads_local_weights,
                                  assert_step_runs_splash_and_gathers_the_head_once, assert_within_plan)

pytestmark = [pytest.mark.tpu_aot, pytest.mark.slow]


@pytest.fixture(scope="module")
def v6e():
    return CompiledSlice("8b", "v6e", 4, (1, 2, 2))


@pytest.mark.parametrize("program", ("sft_step", "mine_generate", "salvage_generate"))
def test_program_compiles_within_the_plan(v6e, program):
    assert_within_plan(v6e, program)


def test_the_decode_loop_reads_local_weights_only(v6e):
    assert_decode_reads_local_weights(v6e)


def test_the_step_runs_splash_and_gathers_the_lm_head_once(v6e):
    assert_step_runs_splash_and_gathers_the_head_once(v6e)
