"""A v6e-64 pod slice (64 chips, mesh (1, 8, 8)) at 32B widths, as its preset lays it out: the mine and salvage
sampler calls (one program at these shapes) compile within 15% of the plan and the decode loop gathers no weights
(a check that fails when one more gather follows a kernel call in the loop). The 32B SFT step on this slice takes
~10 minutes to compile on 2 cores, so it is left to `python -m rmsweb_jax.plan --compile` (BUILD.md gives its
figures)."""
import pytest

from rmsweb_jax.sampling.sampler import DECODE_LOOP_SCOPE
from tests.tpu_aot.slices import (CompiledSlice, assert_decode_reads_local_weights, assert_loop_gathers_no_weights,
                                  assert_within_plan, plant_after_kernel, planted_gather)

pytestmark = [pytest.mark.tpu_aot, pytest.mark.slow]


@pytest.fixture(scope="module")
def pod():
    return CompiledSlice("32b", "v6e", 64, (1, 8, 8))


@pytest.mark.parametrize("program", ("mine_generate", "salvage_generate"))
def test_the_sampler_compiles_within_the_plan(pod, program):
    assert_within_plan(pod, program)


def test_the_decode_loop_reads_local_weights_only(pod):
    assert_decode_reads_local_weights(pod)


def test_the_decode_check_sees_a_gather_planted_after_a_kernel(pod):
    decode = plant_after_kernel(pod.report("mine_generate").hlo, planted_gather("[5120,3200]"), scope=DECODE_LOOP_SCOPE)
    with pytest.raises(AssertionError, match="loop all-gathers 1 weight-sized"):
        assert_loop_gathers_no_weights(decode, DECODE_LOOP_SCOPE)
