"""Mining's reference forward compiled for a v5p and a v6e slice of 4 chips (mesh (1, 2, 2)) at 8B widths, within 15%
of the planner's figure. (The training steps on these slices: test_v5p_small_slice_steps.py and
test_v6e_small_slice_steps.py; the sampler's calls are compiled on the pod slices, test_v5p_pod.py and
test_v6e_pod.py, where the decode layout matters most: make test's workers take whole files, so the minutes of
compiles split between them.)"""
import pytest

from tests.tpu_aot.slices import CompiledSlice, assert_within_plan

pytestmark = [pytest.mark.tpu_aot, pytest.mark.slow]


@pytest.mark.parametrize("chip", ("v5p", "v6e"))
def test_mining_forward_compiles_within_the_plan(chip):
    assert_within_plan(CompiledSlice("8b", chip, 4, (1, 2, 2)), "mine_logprobs")
