"""`python -m rmsweb_jax.plan --compile`: the plan and the compiler side by side for the user's slice, and a
program whose compiled peak does not fit refused, naming it."""
import dataclasses
import pathlib
import re
import subprocess
import sys

import pytest

from rmsweb_jax.errors import UserError
from rmsweb_jax.plan import chips, compiled, tpu_aot
from rmsweb_jax.plan.planner import Plan, StagePlan
from tests.tpu_aot.slices import LOOP_WITH_KERNEL_HLO

pytestmark = [pytest.mark.tpu_aot, pytest.mark.slow]
REPO = pathlib.Path(__file__).resolve().parents[2]


def _plan(*flags):
    """Returns the finished `plan --compile` run of the demo config on a v5p slice of 4 chips."""
    try:
        tpu_aot.libtpu_dir()
    except tpu_aot.LibtpuUnavailable as err:
        pytest.skip(f"libtpu cannot load here: {err}")
    return subprocess.run([sys.executable, "-m", "rmsweb_jax.plan", "--config=configs/demo.py", "--chip=v5p",
                           "--topology=4", "--compile", "--config.mesh.shape=(1,2,2)", *flags],
                          cwd=REPO, capture_output=True, text=True, timeout=2700)


def test_the_demo_compiles_for_a_v5p_slice_beside_its_plan():
    out = _plan()
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    table = out.stdout[out.stdout.index("compiled for 4 x v5p"):]
    for program in ("ground_step", "sft_step", "mine_generate", "mine_logprobs", "salvage_step", "salvage_generate"):
        assert f"\n{program} " in table, table
    assert "cost_analysis TFLOP" in table and "weighted TFLOP" in table and "collective GB" in table, table


def test_a_compiled_program_over_the_budget_is_refused_naming_it():
    stage = StagePlan("sft", 1 << 30, 2 << 30, 1 << 30, 1 << 30, 0, 0, 1e12, 1.0)
    plan = Plan("configs/x.py", chips.chip("v6e"), 4, {"data": 1, "fsdp": 2, "tensor": 2}, "8b", 8, 0.4, 0.9,
                (stage,))
    fits = tpu_aot.CompileReport("sft_step", 1.0, 20 << 30, 0, 0, 5 << 30, 1e12, "")
    compiled.check_fits([compiled.Compared("sft", stage.train_peak, 0.0, fits)], plan)
    over = dataclasses.replace(fits, temp_bytes=10 << 30)
    with pytest.raises(UserError, match=r"program sft_step compiles to 30.00 GiB per device .* gives 26.82 GiB"):
        compiled.check_fits([compiled.Compared("sft", stage.train_peak, 0.0, over)], plan)


def test_the_table_puts_the_weighted_count_beside_cost_analysis():
    """A program's row shows cost_analysis()'s TFLOP and the count with every loop body times its trips, marked '?'
    where a kernel or loop could not be counted (the hand-written loop's kernel has no formula)."""
    try:
        tpu_aot.libtpu_dir()
    except tpu_aot.LibtpuUnavailable as err:
        pytest.skip(f"libtpu cannot load here: {err}")
    stage = StagePlan("sft", 1 << 30, 2 << 30, 1 << 30, 1 << 30, 0, 0, 1e12, 1.0)
    plan = Plan("configs/x.py", chips.chip("v6e"), 4, {"data": 1, "fsdp": 2, "tensor": 2}, "8b", 8, 0.4, 0.9,
                (stage,))
    report = tpu_aot.CompileReport("sft_step", 1.0, 1 << 30, 0, 0, 1 << 30, 2.5e12, LOOP_WITH_KERNEL_HLO)
    head, row = compiled.table([compiled.Compared("sft", stage.train_peak, 0.0, report)], plan).splitlines()[1:3]
    cells = dict(zip(re.split(r"\s{2,}", head.strip()), row.split()))
    assert cells["cost_analysis TFLOP"] == "2.50" and cells["weighted TFLOP"] == "0.00?", (head, row)
