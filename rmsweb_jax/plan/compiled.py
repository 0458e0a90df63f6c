"""The plan beside the compiler: every program of a plan's stages compiled ahead of time for the slice.

`python -m rmsweb_jax.plan --config=... --compile` builds each stage's programs (plan/programs.py) on the
slice's TPU devices (plan/tpu_aot.py, no chip needed), compiles them, and prints the planner's per-device
bytes beside `memory_analysis()`'s and its FLOPs beside `cost_analysis()`'s and beside the compiled HLO's own count
with every loop body times its trip count (`hlo_work.weighted_work`). A program whose compiled peak does not fit the
budget is refused, like a plan that does not fit. The config's libtpu flags (config.tpu.libtpu_init_args) are passed
as compiler options, so the program compiled is the one a TPU VM's libtpu would build from the preset.
"""
from __future__ import annotations

import dataclasses

from rmsweb_jax.distributed import compiler_options
from rmsweb_jax.errors import UserError
from rmsweb_jax.models.from_config import mesh_from_config, rules_from_config
from rmsweb_jax.plan import programs, tpu_aot
from rmsweb_jax.plan.planner import GiB, Plan

# The programs each stage runs, and which of the stage's planned figures each is held to.
STAGE_PROGRAMS = {
    "ground": (("ground_step", "train_peak"),),
    "sft": (("sft_step", "train_peak"),),
    "train_smoke": (("train_smoke_step", "train_peak"),),
    "salvage": (("salvage_step", "train_peak"), ("salvage_generate", "sampling_peak")),
    "mine": (("mine_generate", "sampling_peak"), ("mine_logprobs", "forward_peak")),
}


@dataclasses.dataclass(frozen=True)
class Compared:
    stage: str
    planned_bytes: int
    planned_flops: float       # per device (0: the planner quotes none for this program)
    report: tpu_aot.CompileReport

    @property
    def ratio(self) -> float:
        """Returns compiled peak / planned bytes."""
        return self.report.peak_bytes / max(self.planned_bytes, 1)


def build(name: str, config, model_config, mesh, rules, device_bytes: int | None) -> programs.Program:
    """Returns the program called `name` (STAGE_PROGRAMS) of `config` on `mesh`."""
    stage, kind = name.rsplit("_", 1)
    if kind == "step":
        return programs.train_step(config, model_config, mesh, rules, stage)
    if kind == "generate":
        return programs.sampler_generate(config, model_config, mesh, rules, stage, device_bytes=device_bytes)
    return programs.reference_logprobs(config, model_config, mesh, rules)


def compile_plan(plan: Plan, config, model_config) -> list[Compared]:
    """Returns every program of the plan's stages compiled for the plan's slice, with its planned figure."""
    if plan.chip.name not in tpu_aot.TPU_CHIPS:
        raise UserError(f"--compile compiles for TPU slices ({sorted(tpu_aot.TPU_CHIPS)}); --chip={plan.chip.name!r} "
                        "is compiled on the machine itself")
    try:
        devices = tpu_aot.topology_devices(plan.chip.name, plan.devices)
    except tpu_aot.LibtpuUnavailable as err:
        raise UserError(f"--compile: {err}") from err
    mesh, rules = mesh_from_config(config, devices=devices), rules_from_config(config)
    options = compiler_options(str(config.tpu.libtpu_init_args))
    out = []
    for stage in plan.stages:
        for name, figure in STAGE_PROGRAMS[stage.stage]:
            program = build(name, config, model_config, mesh, rules, plan.chip.hbm_bytes)
            report = tpu_aot.compile_program(name, program.fn, program.args, compiler_options=options)
            flops = stage.device_flops if figure == "train_peak" else 0.0
            out.append(Compared(stage.stage, getattr(stage, figure), flops, report))
    return out


def table(rows: list[Compared], plan: Plan) -> str:
    """Returns the plan-vs-compiler table (GiB and TFLOP per device)."""
    head = ("program", "plan GiB", "compiled GiB", "compiled/plan", "args", "temps", "plan TFLOP",
            "cost_analysis TFLOP", "weighted TFLOP", "collective GB", "compile s")
    lines = [head]
    for r in rows:
        rep, work = r.report, r.report.work
        uncounted = "?" if work.unknown_trip_counts or work.unknown_kernels else ""
        lines.append((rep.name, f"{r.planned_bytes / GiB:.2f}", f"{rep.peak_bytes / GiB:.2f}", f"{r.ratio:.2f}",
                      f"{rep.argument_bytes / GiB:.2f}", f"{rep.temp_bytes / GiB:.2f}",
                      f"{r.planned_flops / 1e12:.2f}" if r.planned_flops else "-", f"{rep.flops / 1e12:.2f}",
                      f"{work.total_flops / 1e12:.2f}{uncounted}",
                      f"{work.total_collective_bytes / 1e9:.2f}", f"{rep.seconds:.1f}"))
    widths = [max(len(x[i]) for x in lines) for i in range(len(head))]
    text = "\n".join("  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(x, widths)))
                     for x in lines)
    return (f"compiled for {plan.devices} x {plan.chip.name} (libtpu {tpu_aot.libtpu_version()}), budget "
            f"{plan.budget / GiB:.1f} GiB per device\n" + text + "\n" + FLOP_COLUMNS + "\n")


FLOP_COLUMNS = ("cost_analysis TFLOP: XLA's count, a loop body once and no Mosaic kernel. weighted TFLOP: dots,\n"
                "convolutions and Mosaic kernels with every loop body times its trip count (hlo_work.weighted_work;\n"
                "'?': a loop or a kernel it could not count). collective GB: what the program's all-gathers,\n"
                "all-reduces, reduce-scatters, all-to-alls and permutes deliver to a device per run.")


def check_fits(rows: list[Compared], plan: Plan) -> None:
    """Raises UserError naming the first compiled program over the plan's budget."""
    for r in rows:
        if r.report.peak_bytes > plan.budget:
            raise UserError(f"{plan.config_name}: program {r.report.name} compiles to {r.report.peak_bytes / GiB:.2f} "
                            f"GiB per device (arguments {r.report.argument_bytes / GiB:.2f}, temporaries "
                            f"{r.report.temp_bytes / GiB:.2f}) but a {plan.chip.name} gives {plan.budget / GiB:.2f} "
                            "GiB; shard wider (config.mesh.shape), more microbatches, a stronger remat policy, "
                            "or a larger slice")

