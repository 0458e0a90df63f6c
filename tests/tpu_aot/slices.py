"""Shared set-up of the tpu_aot tests: a preset at the real 8B / 32B widths with 2 layers, shrunk shapes, on the
devices of a real TPU slice (libtpu's compiler on this CPU), its plan, and its programs compiled once per module.

Every program is the code path its stage runs (rmsweb_jax/plan/programs.py); only the depth (2 text layers, 2
vision blocks) and the row/patch counts are cut so that each compile takes about a minute on 2 cores.

The checks that read a program's loops take its HLO text, so that each is also shown to fail on the same text with
one more gather planted after a kernel call (plant_after_kernel), where a line-by-line reader would stop reading.
"""
from __future__ import annotations

import dataclasses
import importlib
import json
import os
import re

import pytest

from rmsweb_jax.models import qwen3_vl
from rmsweb_jax.models.from_config import mesh_from_config, rules_from_config
from rmsweb_jax.plan import compiled, planner, tpu_aot
from rmsweb_jax.plan.hlo import (instructions, loop_bodies, parse_instruction, read_module, result_bytes,
                                 while_loop_closure)
from rmsweb_jax.plan.hlo_work import trip_count

TOLERANCE = 0.15  # the bound: every compiled peak within 15% of the planner's figure


# A loop of 36 trips whose body calls a kernel with a multi-line attribute (braces and a string holding '}' and '{'),
# then all-gathers and runs a fused 8x8x8 dot after it.
LOOP_WITH_KERNEL_HLO = r'''HloModule planted, entry_computation_layout={(f32[8,8]{1,0})->f32[8,8]{1,0}}

FileNames
1 "/src/model.py"

%fused_dot (p0: f32[8,8], p1: f32[8,8]) -> f32[8,8] {
  %p0 = f32[8,8]{1,0} parameter(0)
  %p1 = f32[8,8]{1,0} parameter(1)
  ROOT %dot.1 = f32[8,8]{1,0} dot(%p0, %p1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

%body (arg: (s32[], f32[8,8])) -> (s32[], f32[8,8]) {
  %arg = (s32[], f32[8,8]{1,0}) parameter(0)
  %i = s32[] get-tuple-element(%arg), index=0
  %x = f32[8,8]{1,0} get-tuple-element(%arg), index=1
  %my_kernel.3 = f32[8,8]{1,0} custom-call(%x), custom_call_target="tpu_custom_call", frontend_attributes={a={
"xprof_metadata":"{\"note\": \"a } and a { in a string\"}"
}}, metadata={op_name="jit(f)/layers/while/body/my_kernel"}, backend_config={"custom_call_config":{"body":"QUJD"}}
  %all-gather.1 = f32[8,64]{1,0} all-gather(%my_kernel.3), channel_id=1, replica_groups=[1,8]<=[8], dimensions={1}
  %fusion.1 = f32[8,8]{1,0} fusion(%my_kernel.3, %x), kind=kOutput, calls=%fused_dot
  %one = s32[] constant(1)
  %next = s32[] add(%i, %one)
  ROOT %tuple.1 = (s32[], f32[8,8]{1,0}) tuple(%next, %fusion.1)
}

%cond (arg: (s32[], f32[8,8])) -> pred[] {
  %arg = (s32[], f32[8,8]{1,0}) parameter(0)
  %i = s32[] get-tuple-element(%arg), index=0
  %n = s32[] constant(36)
  ROOT %lt = pred[] compare(%i, %n), direction=LT
}

ENTRY %main (x: f32[8,8]) -> f32[8,8] {
  %x = f32[8,8]{1,0} parameter(0)
  %zero = s32[] constant(0)
  %init = (s32[], f32[8,8]{1,0}) tuple(%zero, %x)
  %while.1 = (s32[], f32[8,8]{1,0}) while(%init), condition=%cond, body=%body, metadata={op_name="jit(f)/layers/while"}
  ROOT %out = f32[8,8]{1,0} get-tuple-element(%while.1), index=1
}
'''


def model_config(size: str) -> qwen3_vl.Qwen3VLConfig:
    """Returns the `size` ('8b' / '32b') architecture cut to 2 text layers and 2 vision blocks."""
    full = qwen3_vl.preset(size)
    return dataclasses.replace(
        full, text=dataclasses.replace(full.text, num_hidden_layers=2),
        vision=dataclasses.replace(full.vision, depth=2, deepstack_visual_indexes=(0,)))


def slice_config(size: str, chip: str, mesh_shape, *, rows_per_device: int = 1, stages=("sft", "mine", "salvage")):
    """Returns the `size` salvage preset for `chip` with `mesh_shape`, running `stages`, at test shapes: rows of
    2,048 tokens with one 1,024-patch image, 2 microbatches of `rows_per_device` rows a device, sampler calls of
    2 prompts x G = 8 with 128 new tokens."""
    c = importlib.import_module(f"configs.qwen3_vl_{size}_salvage").get_config(chip)
    c.stages = tuple(stages)
    c.mesh.shape = tuple(mesh_shape)
    dp = mesh_shape[0] * mesh_shape[1]
    c.data.buckets = (2048,)
    c.data.bucket_patches = (1024,)
    c.train.microbatches = 2
    c.train.batch_size = 2 * dp * rows_per_device
    c.salvage.train.batch_size = c.train.batch_size
    c.mine.max_batch = c.salvage.sample_batch = 16
    c.mine.max_new_tokens = c.salvage.max_new_tokens = 128
    c.mine.batch_states = dp
    return c


class CompiledSlice:
    """A config's plan on a slice and its programs, each compiled on first use."""

    def __init__(self, size: str, chip: str, chips: int, mesh_shape, **kw):
        try:
            self.devices = tpu_aot.topology_devices(chip, chips)
        except tpu_aot.LibtpuUnavailable as err:
            pytest.skip(f"libtpu cannot load here: {err}")
        self.config = slice_config(size, chip, mesh_shape, **kw)
        self.model_config = model_config(size)
        self.mesh = mesh_from_config(self.config, devices=self.devices)
        self.rules = rules_from_config(self.config)
        self.plan = planner.plan(self.config, chip_name=chip, topology=str(chips), mfu=0.4, usable_fraction=0.9,
                                 model_config=self.model_config, arch=f"{size} at 2 layers")
        self._reports: dict[str, tpu_aot.CompileReport] = {}

    def stage(self, name: str) -> planner.StagePlan:
        return next(s for s in self.plan.stages if s.stage == name)

    def report(self, program: str) -> tpu_aot.CompileReport:
        """Returns the CompileReport of `program` (e.g. 'sft_step'), compiling it the first time."""
        if program not in self._reports:
            built = compiled.build(program, self.config, self.model_config, self.mesh, self.rules,
                                   self.plan.chip.hbm_bytes)
            self._reports[program] = rep = tpu_aot.compile_program(program, built.fn, built.args)
            _record(self, program, rep)
        return self._reports[program]

    def planned(self, program: str) -> int:
        """Returns the planner's per-device bytes for `program` (compiled.STAGE_PROGRAMS says which figure)."""
        for stage, programs in compiled.STAGE_PROGRAMS.items():
            for name, figure in programs:
                if name == program:
                    return getattr(self.stage(stage), figure)
        raise KeyError(program)


def _record(sl: CompiledSlice, program: str, rep: tpu_aot.CompileReport) -> None:
    """Appends the compile's figures as a JSON line to $RMSWEB_AOT_FIGURES, when set (BUILD.md's table)."""
    path = os.environ.get("RMSWEB_AOT_FIGURES")
    if not path:
        return
    from rmsweb_jax.sampling.sampler import DECODE_LOOP_SCOPE
    gathers = instructions(rep.hlo, "all-gather", scope=DECODE_LOOP_SCOPE)
    row = {"program": program, "slice": f"{sl.plan.chip.name} x{sl.plan.devices} {dict(sl.mesh.shape)}",
           "compile_s": round(rep.seconds, 1), "compile_cpu_s": round(rep.cpu_seconds, 1),
           "compiled_gib": rep.peak_bytes / 2 ** 30, "planned_gib": sl.planned(program) / 2 ** 30,
           "tflop_device": rep.flops / 1e12, "weighted_tflop_device": rep.work.total_flops / 1e12,
           "collective_gb_device": rep.work.total_collective_bytes / 1e9,
           "decode_all_gathers": len(gathers) if "generate" in program else None,
           "decode_all_gathers_over_1mib": sum(result_bytes(g) >= 1 << 20 for g in gathers)}
    with open(path, "a") as f:
        f.write(json.dumps(row) + "\n")


def assert_within_plan(sl: CompiledSlice, program: str) -> None:
    """Asserts the compiled peak of `program` is within TOLERANCE of the planner's figure, naming both."""
    rep, want = sl.report(program), sl.planned(program)
    ratio = rep.peak_bytes / want
    G = 2 ** 30
    assert abs(ratio - 1) <= TOLERANCE, (
        f"{program} on {sl.plan.devices} x {sl.plan.chip.name}: compiled peak {rep.peak_bytes / G:.3f} GiB "
        f"(arguments {rep.argument_bytes / G:.3f}, outputs {rep.output_bytes / G:.3f}, aliased "
        f"{rep.alias_bytes / G:.3f}, temporaries {rep.temp_bytes / G:.3f}) vs planned {want / G:.3f} GiB: "
        f"ratio {ratio:.3f}")


def assert_loop_gathers_no_weights(hlo: str, scope: str) -> None:
    """Asserts the while loop named `scope` in `hlo` (its body and all it calls) all-gathers nothing of 1 MiB or
    more."""
    assert while_loop_closure(hlo, scope), f"the {scope} loop was not found in the HLO"
    big = [g for g in instructions(hlo, "all-gather", scope=scope) if result_bytes(g) >= 1 << 20]
    assert not big, f"the {scope} loop all-gathers {len(big)} weight-sized arrays per trip: {big[:3]}"


def assert_decode_reads_local_weights(sl: CompiledSlice) -> None:
    """Asserts the sampler's decode loop (its while body and all it calls) all-gathers nothing of 1 MiB or more."""
    from rmsweb_jax.sampling.sampler import DECODE_LOOP_SCOPE
    assert_loop_gathers_no_weights(sl.report("mine_generate").hlo, DECODE_LOOP_SCOPE)


def lm_head_shard(sl: CompiledSlice) -> str:
    """Returns the printed dims of the LM head's vocabulary shard, whole along D: '[D,V/tensor]'."""
    cfg = sl.model_config.text
    return f"[{cfg.hidden_size},{cfg.vocab_size // sl.mesh.shape['tensor']}]"


def assert_gathers_the_head_once(hlo: str, head: str) -> None:
    """Asserts `hlo` all-gathers an array of dims `head` (lm_head_shard) once in the whole program, in bf16."""
    shapes = [parse_instruction(g).shape for g in instructions(hlo, "all-gather")]
    gathers = [s for s in shapes if head in s]
    assert len(gathers) == 1 and "bf16" in gathers[0], f"all-gathers of the LM head {head}: {gathers}"


def assert_step_runs_splash_and_gathers_the_head_once(sl: CompiledSlice) -> None:
    """Asserts the SFT step holds Mosaic (splash) kernels, and all-gathers the LM head's vocabulary shard, whole along
    D and in bf16, once (forward and backward share it; the microbatch scan runs that one instruction M times)."""
    rep = sl.report("sft_step")
    assert "tpu_custom_call" in rep.hlo, "no Mosaic (splash) kernel in the compiled step"
    assert_gathers_the_head_once(rep.hlo, lm_head_shard(sl))


def assert_step_work_counts_every_trip(sl: CompiledSlice) -> None:
    """Asserts the SFT step's trip-count-weighted work (CompileReport.work) reads every loop's trip count and every
    kernel, the microbatch loop's as config.train.microbatches, and comes to at least microbatches x layers times
    cost_analysis()'s FLOPs, which count each loop body once."""
    rep, microbatches = sl.report("sft_step"), sl.config.train.microbatches
    work = rep.work
    assert work.unknown_trip_counts == () and work.unknown_kernels == (), work
    module = read_module(rep.hlo)
    entry = {i.name: i for i in module.computations[module.entry]}
    loops = [trip_count(i, entry, module.computations) for i in entry.values() if i.opcode == "while"]
    assert loops == [(microbatches, True)], f"the step's top-level loops (trips, exact): {loops}"
    assert work.flops >= microbatches * sl.model_config.text.num_hidden_layers * rep.flops, (work.flops, rep.flops)


def plant_after_kernel(hlo: str, planted: str, *, scope: str | None = None) -> str:
    """Returns `hlo` with the instruction `planted` put right after a Mosaic kernel call whose attributes run on over
    lines starting with '}' (what a line-by-line reader stops at): inside the loop named `scope` (after a copy of such
    a call when the loop holds none), or without `scope` after the first such call inside any while body."""
    module = read_module(hlo)
    kernels = {i.name: i for insts in module.computations.values() for i in insts
               if 'custom_call_target="tpu_custom_call"' in i.attributes and re.search(r"\n\s*\}", i.text)}
    assert kernels, "no Mosaic kernel call with a '}' continuation line in the module"
    bodies = loop_bodies(hlo, scope) if scope else [
        re.search(r"body=%([\w.\-]+)", i.attributes).group(1)
        for insts in module.computations.values() for i in insts if i.opcode == "while"]
    assert bodies, f"no while loop {'named ' + scope if scope else ''} in the module"
    for body in bodies:
        for inst in module.computations[body]:
            if inst.name in kernels:
                return hlo.replace(inst.text, f"{inst.text}\n  {planted}", 1)
    if scope is None:
        raise AssertionError("no while body calls a Mosaic kernel directly")
    kernel = next(iter(kernels.values()))
    copy = kernel.text.replace(f"%{kernel.name} ", f"%planted.{kernel.name} ", 1)
    anchor = module.computations[bodies[0]][0].text
    return hlo.replace(anchor, f"{anchor}\n  {copy}\n  {planted}", 1)


def planted_gather(dims: str) -> str:
    """Returns a bf16 all-gather instruction of result dims `dims` (e.g. '[4096,75968]') to plant in a module."""
    return (f"%planted.all-gather = bf16{dims}{{1,0}} all-gather(%planted.operand), channel_id=9999, "
            "replica_groups=[1,2]<=[2], dimensions={1}, use_global_device_ids=true")
