"""The plan of a config on a slice: per-device bytes of each stage it runs, model FLOPs and step time.

A stage's peak is parameters + optimizer state + max(step temporaries, sampling): see plan/memory.py
for how each figure is found. `check_fits` refuses, with the figures, a plan over the chip's budget.
"""
from __future__ import annotations

import dataclasses
import pathlib

import numpy as np

from rmsweb_jax.errors import UserError
from rmsweb_jax.models import qwen3_vl
from rmsweb_jax.models.from_config import rules_from_config
from rmsweb_jax.plan import chips, memory
from rmsweb_jax.sampling.model_from_config import RANDOM_PRESETS
from rmsweb_jax.stages.salvage import train_config as salvage_train_config
from rmsweb_jax.train.batch import check_batch_layout
from rmsweb_jax.train.metrics import train_flops

GiB = 1024 ** 3


@dataclasses.dataclass(frozen=True)
class StagePlan:
    stage: str
    params: int                 # per-device bytes, in config.model.param_dtype
    optimizer: int              # AdamW moments (+ counts), like their parameters
    gradients: int              # per-device gradient bytes inside the step (0: no training)
    activations: int            # saved residuals of one microbatch + the recomputed layer
    kv_cache: int               # the sampler's cache of one generate call (0: no sampling)
    extra: int                  # a frozen KL reference, a per-layer decode copy of the text weights
    flops: float                # model FLOPs of one step (training stages), all devices
    step_s: float               # per-device FLOPs (text / devices + the replicated vision tower) / (peak x mfu)
    notes: tuple[str, ...] = ()

    @property
    def total(self) -> int:
        return self.params + self.optimizer + self.extra + max(self.gradients + self.activations, self.kv_cache)


@dataclasses.dataclass(frozen=True)
class Plan:
    config_name: str
    chip: chips.Chip
    devices: int
    mesh: dict[str, int]
    architecture: str
    parameters: int             # element count
    mfu: float
    usable_fraction: float
    stages: tuple[StagePlan, ...]

    @property
    def budget(self) -> int:
        return int(self.chip.hbm_bytes * self.usable_fraction)

    def worst(self) -> StagePlan:
        return max(self.stages, key=lambda s: s.total)

    def fits(self) -> bool:
        return self.worst().total <= self.budget

    def table(self) -> str:
        """Returns the plan as a readable text table (GiB per device)."""
        head = (f"{self.config_name} on {self.devices} x {self.chip.name} ({self.chip.hbm_bytes / GiB:.1f} GiB HBM, "
                f"{self.chip.peak_flops / 1e12:.0f} TFLOP/s bf16 each), mesh {self.mesh}\n"
                f"model {self.architecture}: {self.parameters / 1e9:.3g} B parameters; budget "
                f"{self.budget / GiB:.1f} GiB per device ({self.usable_fraction:.0%} of HBM)\n")
        rows = [("GiB/device", "params", "optimizer", "grads", "activations", "kv cache", "other", "peak", "fits",
                 "TFLOP/step", f"step s @{self.mfu:.0%} MFU")]
        for s in self.stages:
            rows.append((s.stage, *(f"{b / GiB:.3g}" for b in (s.params, s.optimizer, s.gradients, s.activations,
                                                              s.kv_cache, s.extra, s.total)),
                         "yes" if s.total <= self.budget else "NO",
                         f"{s.flops / 1e12:.1f}" if s.flops else "-", f"{s.step_s:.2f}" if s.flops else "-"))
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        lines = ["  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))) for r in rows]
        notes = [f"  {s.stage}: {n}" for s in self.stages for n in s.notes]
        return head + "\n".join(lines) + ("\nnotes:\n" + "\n".join(notes) if notes else "") + "\n"

    def check_fits(self) -> None:
        """Raises UserError naming the stage, its figures and the budget when the plan does not fit."""
        w = self.worst()
        if w.total <= self.budget:
            return
        parts = ", ".join(f"{k} {getattr(w, k) / GiB:.2f}" for k in ("params", "optimizer", "gradients",
                                                                       "activations", "kv_cache", "extra"))
        raise UserError(f"{self.config_name}: stage {w.stage} needs {w.total / GiB:.2f} GiB per device ({parts} GiB) "
                        f"but a {self.chip.name} gives {self.budget / GiB:.2f} GiB ({self.usable_fraction:.0%} of "
                        f"{self.chip.hbm_bytes / GiB:.1f}); shard wider (config.mesh.shape), raise "
                        "config.train.microbatches, a stronger config.model.remat_policy, or a larger slice")


def architecture(config, override: str = "") -> tuple[qwen3_vl.Qwen3VLConfig, str]:
    """Returns (architecture, its name): `override` ('8b', '32b', 'tiny', 'demo' or a config.json path), else
    config.model.init's checkpoint config.json or random preset, else config.plan.architecture."""
    init = str(config.model.init)
    if not override and init.startswith("hf:"):
        path = pathlib.Path(init[3:]).expanduser() / "config.json"
        if path.is_file():
            return qwen3_vl.Qwen3VLConfig.from_json_file(path), str(path)
        override = str(config.plan.architecture) if "plan" in config else ""
        if not override:
            raise UserError(f"config.model.init = {init!r}: {path} is not on this machine; give --architecture="
                            "8b|32b|<path to config.json> (or config.plan.architecture)")
    elif not override and init.startswith("random:"):
        name = init[len("random:"):]
        if name in RANDOM_PRESETS:
            return RANDOM_PRESETS[name][0](), init
        override = name
    if override.endswith(".json"):
        return qwen3_vl.Qwen3VLConfig.from_json_file(override), override
    try:
        return qwen3_vl.preset(override), override
    except ValueError as err:
        raise UserError(f"--architecture={override!r}: {err} (or a path to an HF config.json)") from err


def plan(config, *, chip_name: str, topology: str, mfu: float, usable_fraction: float, config_name: str = "config",
         arch: str = "") -> Plan:
    """Returns the Plan of `config`'s stages on `topology` chips of `chip_name`, from abstract shapes only."""
    chip = chips.chip(chip_name)
    if not 0 < mfu <= 1 or not 0 < usable_fraction <= 1:
        raise UserError(f"--mfu={mfu} and --usable_hbm={usable_fraction} must be in (0, 1]")
    devices = chips.device_count(chip, topology)
    axes = memory.mesh_shape(config.mesh.shape, devices)
    mesh, rules = memory.abstract_mesh(axes), rules_from_config(config)
    model_config, arch_name = architecture(config, arch)
    state = memory.state_bytes(model_config, config, mesh)
    n_params = qwen3_vl.parameter_count(model_config)
    stages = [s for s in dict.fromkeys(str(x) for part in config.stages for x in str(part).split(","))
              if s in memory.TRAIN_STAGES + memory.SAMPLING_STAGES]
    if not stages:
        raise UserError(f"config.stages = {tuple(config.stages)} runs no stage the planner sizes; expected some of "
                        f"{memory.TRAIN_STAGES + memory.SAMPLING_STAGES}")
    out = [_stage(s, config, model_config, state, mesh, rules, chip, devices, mfu) for s in stages]
    return Plan(config_name, chip, devices, axes, arch_name, n_params, mfu, usable_fraction, tuple(out))


def _seq_len(stage: str, config) -> tuple[int, int]:
    """Returns (row length, image patches per row) of the stage's training rows: the largest bucket's."""
    if stage == "train_smoke":
        return int(config.train_smoke.seq_len), 0
    buckets, patches = list(config.data.buckets), list(config.data.bucket_patches)
    i = int(np.argmax(buckets))
    return int(buckets[i]), int(patches[i])


def _stage(stage, config, model_config, state, mesh, rules, chip, devices, mfu) -> StagePlan:
    train = stage in memory.TRAIN_STAGES
    seq_len, row_patches = _seq_len(stage, config)
    runtime = memory.runtime_for(config, chip.name, seq_len)
    notes = []
    grads = acts = kv = extra = 0
    flops = device_flops = 0.0
    if train:
        # Salvage-DS trains with config.salvage.train over config.train (its own batch size, e.g.)
        train_block = salvage_train_config(config).train if stage == "salvage" else config.train
        batch, micro = int(train_block.batch_size), int(train_block.microbatches)
        try:
            rows = check_batch_layout(batch, micro, mesh)
        except ValueError as err:
            raise UserError(str(err)) from err
        local_rows = rows // (mesh.shape["data"] * mesh.shape["fsdp"])
        merge = model_config.vision.spatial_merge_size ** 2
        patches = -(-rows * row_patches // merge) * merge
        local = memory.local_model_config(model_config, mesh, rules)
        acts = memory.activation_bytes(local, runtime, local_rows, seq_len, patches)
        grads = state["params"] * (2 if micro > 1 else 1)  # M > 1: the scan's accumulator beside each microbatch's
        images = batch * (1 + int(config.prompt.history_images)) if row_patches else 0
        text = train_flops(model_config, tokens=batch * seq_len, seq_len=seq_len)
        flops = train_flops(model_config, tokens=batch * seq_len, seq_len=seq_len, patches=batch * row_patches,
                            images=images)
        if stage == "salvage":  # the old-policy log-probs (and a KL reference) are one forward pass each
            text, flops = ((4 + (config.salvage.loss.kl_beta > 0)) / 3 * f for f in (text, flops))
        # Every device runs the whole vision tower (replicated patches): its FLOPs are not divided.
        device_flops = text / devices + (flops - text)
        if flops > text:
            notes.append(f"vision tower replicated: {(flops - text) / (chip.peak_flops * mfu):.2f} s of each step "
                         f"on every device ({(flops - text) / flops:.0%} of the model FLOPs)")
        notes.append(f"step: {micro} microbatch(es) of {rows} rows x {seq_len} tokens ({local_rows} per device)"
                     + (f", {patches} image patches replicated on every device" if patches else "")
                     + f"; remat {runtime.remat_policy}, attention traced as {runtime.attention_impl}")
    if stage in memory.SAMPLING_STAGES:
        block = config.salvage if stage == "salvage" else config.mine
        rows = int(block.sample_batch if stage == "salvage" else block.max_batch)
        max_new = int(block.max_new_tokens)
        prompt = max(max(int(b) for b in config.data.buckets) - max_new, 1)
        kv = memory.kv_cache_bytes(model_config, runtime, mesh, rules, rows, prompt, max_new)
        notes.append(f"sampling: KV cache of {rows} rows x (prompt bucket {memory.prompt_bucket(prompt)} + {max_new} "
                     f"new) tokens (prompts <= {prompt} tokens: the longest row less the response)")
        if runtime.decode_layout == "per_layer":
            extra += state["text_params"] * memory.dtype_bytes(runtime.compute_dtype) // memory.dtype_bytes(
                runtime.param_dtype)
            notes.append("decode_layout per_layer: a second copy of the text weights in the compute dtype")
    if stage == "salvage" and config.salvage.loss.kl_beta > 0:
        extra += state["params"]
        notes.append("kl_beta > 0: the frozen SFT parameters")
    optimizer = state["optimizer"] if train else 0
    step_s = device_flops / (chip.peak_flops * mfu)
    return StagePlan(stage, state["params"], optimizer, grads, acts, kv, extra, flops, step_s, tuple(notes))
