"""The Salvage-DS training step compiled for a v5p slice of 4 chips (mesh (1, 2, 2)) at 8B widths, within 15% of the
planner's figure. The SFT step is compiled for v5p on the pod slice (test_v5p_pod.py: the same program on a larger
mesh, where the splash and LM-head checks run) and for v6e on 4 chips (test_v6e_small_slice_steps.py); mining's
forward on both small slices: test_small_slice_forward.py. One file a slice, because make test's workers take whole
files: the minutes of compiles of the slices run on two workers, not one after the other on one.

Salvage's step is compiled on this slice only: on v6e it is the SFT step's program with the RL loss (the same GiB
to three digits in BUILD.md's table), and at 387 s of CPU it was the longest of make test's compiles left to run
after the rest of the suite. The v5p small slice's SFT step (218 CPU-s) was dropped for make test's 40 minutes: the
pod compiles the same code path. The demo's salvage step also compiles for v5p in test_plan_compile_cli.py."""
import pytest

from tests.tpu_aot.slices import CompiledSlice, assert_within_plan

pytestmark = [pytest.mark.tpu_aot, pytest.mark.slow]


def test_the_salvage_step_compiles_within_the_plan():
    assert_within_plan(CompiledSlice("8b", "v5p", 4, (1, 2, 2)), "salvage_step")
