"""The plan of a config on a slice: per-device bytes of each stage it runs, model FLOPs and step time.

A stage's peak is parameters + optimizer state + max(step temporaries, sampling): see plan/memory.py
for how each figure is found. `check_fits` refuses, with the figures, a plan over the chip's budget.
"""
from __future__ import annotations

import dataclasses
import math
import pathlib

from rmsweb_jax.errors import UserError
from rmsweb_jax.models import qwen3_vl, sharding
from rmsweb_jax.models.from_config import rules_from_config
from rmsweb_jax.plan import chips, memory, programs
from rmsweb_jax.model_init import RANDOM_PRESETS
from rmsweb_jax.stages.train_overrides import with_train_overrides
from rmsweb_jax.train.batch import check_batch_layout
from rmsweb_jax.train.metrics import train_flops

GiB = 1024 ** 3


@dataclasses.dataclass(frozen=True)
class StagePlan:
    """One stage's per-device bytes, by program: its train step, its sampler calls, its forward-only passes."""
    stage: str
    params: int                 # per-device bytes, in config.model.param_dtype
    optimizer: int              # AdamW moments (+ counts), like their parameters
    gradients: int              # per-device gradient bytes inside the step (0: no training)
    activations: int            # saved residuals of one microbatch + the recomputed layer
    kv_cache: int               # the sampler's caches of one generate call: the prefill's and the decode rows' (0: none)
    extra: int                  # a frozen KL reference (resident through the stage)
    flops: float                # model FLOPs of one step (training stages), all devices
    step_s: float               # per-device FLOPs (text / devices + the replicated vision tower) / (peak x mfu)
    notes: tuple[str, ...] = ()
    loss_head: int = 0          # the train step's LM-head buffers on a mesh (gathered W, dW)
    decode_copy: int = 0        # the sampler's text weights in its decode layout (or the CPU per-layer copy)
    prefill: int = 0            # temporaries of the sampler's prefill (one layer's or vision block's at a time)
    forward: int = 0            # temporaries of a forward-only pass (mining's reference log-probs)
    unread: int = 0             # parameter bytes the sampler's program never reads (the head: the copy's is used)
    device_flops: float = 0.0   # the train step's FLOPs on one device

    @property
    def train_peak(self) -> int:
        """Returns the train step's peak: the state, gradients, saved activations and the loss's head buffers."""
        if not self.gradients:
            return 0
        return self.params + self.optimizer + self.gradients + self.activations + self.loss_head

    @property
    def sampling_peak(self) -> int:
        """Returns a sampler call's peak: the parameters, the decode copy, the KV caches and the prefill."""
        if not self.kv_cache:
            return 0
        return self.params - self.unread + self.decode_copy + self.kv_cache + self.prefill

    @property
    def forward_peak(self) -> int:
        """Returns a forward-only pass's peak: the parameters and its temporaries."""
        return self.params + self.forward if self.forward else 0

    @property
    def total(self) -> int:
        """Returns the stage's peak: its largest program, with what stays resident beside it (optimizer state
        while sampling between updates, a frozen KL reference)."""
        resident = self.optimizer if self.gradients else 0
        return self.extra + max(self.train_peak, self.sampling_peak + resident, self.forward_peak + resident)


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
        rows = [("GiB/device", "params", "optimizer", "grads", "activations", "kv cache", "prefill", "decode copy",
                 "other", "peak", "fits", "TFLOP/step", f"step s @{self.mfu:.0%} MFU")]
        for s in self.stages:
            rows.append((s.stage, *(f"{b / GiB:.3g}" for b in (s.params, s.optimizer, s.gradients,
                                                              s.activations + s.loss_head, s.kv_cache, s.prefill,
                                                              s.decode_copy, s.extra + s.forward, s.total)),
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
                                                                       "activations", "loss_head", "kv_cache",
                                                                       "prefill", "decode_copy", "forward", "extra"))
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
         arch: str = "", model_config: qwen3_vl.Qwen3VLConfig | None = None) -> Plan:
    """Returns the Plan of `config`'s stages on `topology` chips of `chip_name`, from abstract shapes only."""
    chip = chips.chip(chip_name)
    if not 0 < mfu <= 1 or not 0 < usable_fraction <= 1:
        raise UserError(f"--mfu={mfu} and --usable_hbm={usable_fraction} must be in (0, 1]")
    devices = chips.device_count(chip, topology)
    axes = memory.mesh_shape(config.mesh.shape, devices)
    mesh, rules = memory.abstract_mesh(axes), rules_from_config(config)
    if model_config is None:
        model_config, arch_name = architecture(config, arch)
    else:
        arch_name = arch or "given"
    state = memory.state_bytes(model_config, config, mesh)
    n_params = qwen3_vl.parameter_count(model_config)
    stages = [s for s in dict.fromkeys(str(x) for part in config.stages for x in str(part).split(","))
              if s in memory.TRAIN_STAGES + memory.SAMPLING_STAGES]
    if not stages:
        raise UserError(f"config.stages = {tuple(config.stages)} runs no stage the planner sizes; expected some of "
                        f"{memory.TRAIN_STAGES + memory.SAMPLING_STAGES}")
    out = [_stage(s, config, model_config, state, mesh, rules, chip, devices, mfu) for s in stages]
    return Plan(config_name, chip, devices, axes, arch_name, n_params, mfu, usable_fraction, tuple(out))


def _stage(stage, config, model_config, state, mesh, rules, chip, devices, mfu) -> StagePlan:
    train = stage in memory.TRAIN_STAGES
    shapes = programs.train_shapes(config, "sft" if stage in memory.SAMPLING_STAGES and not train else stage)
    seq_len, row_patches = shapes.seq_len, shapes.row_patches
    runtime = memory.runtime_for(config, chip.name, seq_len)
    local = memory.local_model_config(model_config, mesh, rules)
    dp = mesh.shape["data"] * mesh.shape["fsdp"]
    merge = model_config.vision.spatial_merge_size ** 2
    notes = []
    sizes = dict(gradients=0, activations=0, kv_cache=0, extra=0, loss_head=0, decode_copy=0, prefill=0, forward=0,
                 unread=0)
    flops = device_flops = 0.0
    if train:
        # ground and Salvage-DS train with config.<stage>.train over config.train (their own batch size, e.g.)
        train_block = with_train_overrides(config, stage).train
        batch, micro = int(train_block.batch_size), int(train_block.microbatches)
        try:
            rows = check_batch_layout(batch, micro, mesh)
        except ValueError as err:
            raise UserError(str(err)) from err
        local_rows = rows // dp
        patches = -(-rows * row_patches // merge) * merge
        sizes["activations"] = memory.activation_bytes(local, runtime, local_rows, seq_len, patches)
        # M > 1: the scan's accumulator beside each microbatch's
        sizes["gradients"] = state["params"] * (2 if micro > 1 else 1)
        sizes["loss_head"] = memory.loss_head_bytes(model_config, runtime, mesh, rules, backward=True)
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
        _sampling(stage, config, model_config, local, state, mesh, rules, chip, runtime, sizes, notes)
    if stage == "mine" and config.mine.reference_logprob:
        rows = -(-int(config.mine.batch_states) // dp) * dp
        sizes["forward"] = (memory.forward_bytes(local, runtime, rows // dp, seq_len,
                                                 -(-rows * row_patches // merge) * merge)
                            + memory.loss_head_bytes(model_config, runtime, mesh, rules, backward=False))
    if stage == "salvage" and config.salvage.loss.kl_beta > 0:
        sizes["extra"] += state["params"]
        notes.append("kl_beta > 0: the frozen SFT parameters")
    optimizer = state["optimizer"] if train else 0
    step_s = device_flops / (chip.peak_flops * mfu)
    return StagePlan(stage, state["params"], optimizer, sizes["gradients"], sizes["activations"], sizes["kv_cache"],
                     sizes["extra"], flops, step_s, tuple(notes), loss_head=sizes["loss_head"],
                     decode_copy=sizes["decode_copy"], prefill=sizes["prefill"], forward=sizes["forward"],
                     unread=sizes["unread"], device_flops=device_flops)


def _sampling(stage, config, model_config, local, state, mesh, rules, chip, runtime, sizes, notes) -> None:
    """Fills `sizes` with one sampler call's figures (sampling/sampler.py `_generate`): the prefill of the prompts
    padded to the batch shards, its KV cache and the decode rows' (group_decode "cascade": one prompt cache per
    prompt + each row's own max_new slots; "copy": the prompt's cache and its G copies, both alive at the repeat),
    the decode copy of the text weights in the layout the sampler picks for this chip."""
    shapes = programs.sampling_shapes(config, stage)
    dp = mesh.shape["data"] * mesh.shape["fsdp"]
    real = max(shapes.rows // shapes.group_size, 1)
    prefill_rows = real + -real % dp
    decode_rows = real * shapes.group_size
    bucket = memory.prompt_bucket(shapes.prompt_len)
    row_patches = programs.train_shapes(config, "sft").row_patches
    merge = model_config.vision.spatial_merge_size ** 2
    patches = -(-real * row_patches // merge) * merge  # the padding rows carry no image
    text_copy = state["text_params"] * memory.dtype_bytes(runtime.compute_dtype) // memory.dtype_bytes(
        runtime.param_dtype)
    if runtime.decode_layout == "per_layer":
        layout = "training"
        sizes["decode_copy"] = text_copy
        notes.append("decode_layout per_layer: a second copy of the text weights in the compute dtype")
    else:
        layout = sharding.pick_decode_sharding(runtime.decode_sharding, mesh,
                                               text_copy * math.prod(mesh.shape.values()), chip.hbm_bytes)
        sizes["decode_copy"] = memory.decode_copy_bytes(model_config, runtime, mesh, rules, layout)
        # From the first sampled token on, the head is the copy's: the training layout's shard goes unread (pruned).
        sizes["unread"] = state["head"] if layout != "training" else 0
    decode_rules = sharding.decode_rules(rules, layout)
    if shapes.group_size > 1 and runtime.group_decode == "cascade":
        # One prompt cache per prompt (bucket slots), read by its G rows, and each row's own max_new slots
        # (kv_cache_bytes is linear in the slots: the difference is the rows' own cache alone).
        prompt_only = memory.kv_cache_bytes(model_config, runtime, mesh, rules, prefill_rows, shapes.prompt_len, 0)
        own = (memory.kv_cache_bytes(model_config, runtime, mesh, decode_rules, decode_rows, shapes.prompt_len,
                                     shapes.max_new_tokens)
               - memory.kv_cache_bytes(model_config, runtime, mesh, decode_rules, decode_rows, shapes.prompt_len, 0))
        kept, loop = prompt_only, own  # the prompts' cache stays alive beside the loop's
        sizes["kv_cache"] = prompt_only + own
    else:
        kept, loop = 0, memory.kv_cache_bytes(model_config, runtime, mesh, decode_rules, decode_rows,
                                              shapes.prompt_len, shapes.max_new_tokens)
        sizes["kv_cache"] = memory.kv_cache_bytes(model_config, runtime, mesh, rules, prefill_rows,
                                                  shapes.prompt_len, shapes.max_new_tokens) + loop
    if runtime.decode_compaction and math.prod(mesh.shape.values()) == 1:
        # The loop's first compaction copies its live half: the rows' cache and that half are both alive then.
        sizes["kv_cache"] = max(sizes["kv_cache"], kept + loop + loop // 2)
        notes.append("sampling: decode_compaction on one device: the first compaction holds the decode rows' cache "
                     "and its live half together")
    sizes["prefill"] = memory.forward_bytes(local, runtime, prefill_rows // dp, bucket, patches)
    notes.append(f"sampling: {real} prompt(s) prefilled as {prefill_rows} rows of {bucket} tokens, {decode_rows} rows "
                 f"x {shapes.max_new_tokens} new tokens decoded")
    if sizes["decode_copy"] and layout != "training":
        notes.append(f"sampling: decode copy of the text weights laid out '{layout}', {sizes['decode_copy'] / GiB:.2f} "
                     f"GiB a device, remade after every weight update: ~{sizes['decode_copy'] / chip.link_bytes_per_s:.2f}"
                     f" s at {chip.link_bytes_per_s / 1e9:.0f} GB/s chip-to-chip (an estimate; the salvage stage logs "
                     "the measured decode_resync_s)")
