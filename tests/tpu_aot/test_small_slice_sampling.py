"""Mining's reference forward and the mine / salvage sampler calls compiled for a v5p and a v6e slice of 4 chips (mesh
(1, 2, 2)) at 8B widths: each compiles within 15% of the planner's figure, and the sampler's decode loop gathers no
weights. (The training steps on these slices: test_small_slice_steps.py.)"""
import pytest

from tests.tpu_aot.slices import CompiledSlice, assert_decode_reads_local_weights, assert_within_plan

pytestmark = [pytest.mark.tpu_aot, pytest.mark.slow]


@pytest.fixture(scope="module", params=("v5p", "v6e"))
def small_slice(request):
    return CompiledSlice("8b", request.param, 4, (1, 2, 2))


@pytest.mark.parametrize("program", ("mine_logprobs", "mine_generate", "salvage_generate"))
def test_program_compiles_within_the_plan(small_slice, program):
    assert_within_plan(small_slice, program)


def test_the_decode_loop_reads_local_weights_only(small_slice):
    assert_decode_reads_local_weights(small_slice)
