"""Shared set-up of the tpu_aot tests: a preset at the real 8B / 32B widths with 2 layers, shrunk shapes, on the
devices of a real TPU slice (libtpu's compiler on this CPU), its plan, and its programs compiled once per module.

Every program is the code path its stage runs (rmsweb_jax/plan/programs.py); only the depth (2 text layers, 2
vision blocks) and the row/patch counts are cut so that each compile takes about a minute on 2 cores.
"""
from __future__ import annotations

import dataclasses
import importlib
import json
import os

import pytest

from rmsweb_jax.models import qwen3_vl
from rmsweb_jax.models.from_config import mesh_from_config, rules_from_config
from rmsweb_jax.plan import compiled, planner, tpu_aot

TOLERANCE = 0.15  # the bound: every compiled peak within 15% of the planner's figure


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
    gathers = tpu_aot.instructions(rep.hlo, "all-gather", scope=DECODE_LOOP_SCOPE)
    row = {"program": program, "slice": f"{sl.plan.chip.name} x{sl.plan.devices} {dict(sl.mesh.shape)}",
           "compile_s": round(rep.seconds, 1), "compile_cpu_s": round(rep.cpu_seconds, 1), "compiled_gib": rep.peak_bytes / 2 ** 30,
           "planned_gib": sl.planned(program) / 2 ** 30, "tflop_device": rep.flops / 1e12,
           "decode_all_gathers": len(gathers) if "generate" in program else None,
           "decode_all_gathers_over_1mib": sum(tpu_aot.result_bytes(g) >= 1 << 20 for g in gathers)}
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


def assert_decode_reads_local_weights(sl: CompiledSlice) -> None:
    """Asserts the sampler's decode loop (its while body and all it calls) all-gathers nothing of 1 MiB or more."""
    from rmsweb_jax.sampling.sampler import DECODE_LOOP_SCOPE
    rep = sl.report("mine_generate")
    assert tpu_aot.while_loop_closure(rep.hlo, DECODE_LOOP_SCOPE), "the decode loop was not found in the HLO"
    big = [g for g in tpu_aot.instructions(rep.hlo, "all-gather", scope=DECODE_LOOP_SCOPE)
           if tpu_aot.result_bytes(g) >= 1 << 20]
    assert not big, f"the decode loop all-gathers {len(big)} weight-sized arrays per token: {big[:3]}"


def assert_step_runs_splash_and_gathers_the_head_once(sl: CompiledSlice) -> None:
    """Asserts the SFT step holds Mosaic (splash) kernels, and all-gathers the LM head's vocabulary shard, whole along
    D and in bf16, once (forward and backward share it; the microbatch scan runs that one instruction M times)."""
    rep, cfg = sl.report("sft_step"), sl.model_config.text
    assert "tpu_custom_call" in rep.hlo, "no Mosaic (splash) kernel in the compiled step"
    shape = f"[{cfg.hidden_size},{cfg.vocab_size // sl.mesh.shape['tensor']}]"
    gathers = [g for g in tpu_aot.instructions(rep.hlo, "all-gather") if shape in g.split("all-gather")[0]]
    assert len(gathers) == 1 and "bf16" in gathers[0].split("all-gather")[0], gathers
