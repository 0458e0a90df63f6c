"""Pod-sized slices at 8B and 32B widths, as their presets lay them out: a mining sampler call (and on v5p the SFT
step) compiles within 15% of the plan, and the decode loop gathers no weights (v5p-64: 32 chips, mesh (1, 16, 2);
v6e-64: 64 chips, mesh (1, 8, 8)). Each pod compile takes 2-10 minutes on 2 cores, so the v6e-64 SFT step is left
to `python -m rmsweb_jax.plan --compile` (BUILD.md gives its figures)."""
import pytest

from tests.tpu_aot.slices import CompiledSlice, assert_decode_reads_local_weights, assert_within_plan

pytestmark = [pytest.mark.tpu_aot, pytest.mark.slow]
SLICES = {"v5p-64 8b": ("8b", "v5p", 32, (1, 16, 2)), "v6e-64 32b": ("32b", "v6e", 64, (1, 8, 8))}


@pytest.fixture(scope="module", params=sorted(SLICES))
def pod(request):
    return CompiledSlice(*SLICES[request.param])


def test_the_sampler_compiles_within_the_plan(pod):
    assert_within_plan(pod, "mine_generate")


def test_the_v5p_pod_sft_step_compiles_within_the_plan():
    assert_within_plan(CompiledSlice(*SLICES["v5p-64 8b"]), "sft_step")


def test_the_decode_loop_reads_local_weights_only(pod):
    assert_decode_reads_local_weights(pod)
