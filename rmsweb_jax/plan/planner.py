"""The plan of a config on a slice: per-device bytes of each stage it runs, its step's time and MFU ceiling.

A stage's peak is parameters + optimizer state + max(step temporaries, sampling): see plan/memory.py
for how each figure is found, plan/step_time.py for the step's FLOPs and collectives. `check_fits`
refuses, with the figures, a plan over the chip's budget.
"""
from __future__ import annotations

import dataclasses
import math
import pathlib

from rmsweb_jax.errors import UserError
from rmsweb_jax.models import qwen3_vl, sharding
from rmsweb_jax.models.from_config import host_copy_config, host_mesh_shape, rules_from_config, runtime_from_config
from rmsweb_jax.distributed import compiler_options
from rmsweb_jax.plan import chips, memory, programs, step_time
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
    step_s: float               # the step's time estimate (step_time.StepTime.step_s; 0: no training)
    notes: tuple[str, ...] = ()
    loss_head: int = 0          # the train step's LM-head buffers on a mesh (gathered W, dW)
    decode_copy: int = 0        # the sampler's text weights in its decode layout (or the CPU per-layer copy)
    prefill: int = 0            # temporaries of the sampler's prefill (one layer's or vision block's at a time)
    forward: int = 0            # temporaries of a forward-only pass (mining's reference log-probs)
    unread: int = 0             # parameter bytes the sampler's program never reads (the head: the copy's is used)
    device_flops: float = 0.0   # the train step's FLOPs on one device
    time: step_time.StepTime | None = None  # the train step's compute and collectives (None: no training)
    host_copy: int = 0          # mine's rollouts on several hosts: each host's own policy copy (the global model
                                # released first), its decode copy and the KV cache of its browsers' rows

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

    def resident_beside(self, figure: str) -> int:
        """Returns the bytes that stay in HBM beside the program held to `figure` ('train_peak', 'sampling_peak',
        'forward_peak') but are not its own: a training stage's optimizer state while it samples or runs a forward
        pass between updates, and a frozen KL reference through the whole stage."""
        return self.extra + (self.optimizer if self.gradients and figure != "train_peak" else 0)

    @property
    def total(self) -> int:
        """Returns the stage's peak: its largest program, with what stays resident beside it."""
        figures = ("train_peak", "sampling_peak", "forward_peak")
        return max([getattr(self, f) + self.resident_beside(f) for f in figures if getattr(self, f)]
                   + [self.host_copy], default=self.extra)


@dataclasses.dataclass(frozen=True)
class Plan:
    config_name: str
    chip: chips.Chip
    devices: int
    mesh: dict[str, int]
    architecture: str
    parameters: int             # element count
    mfu: float                  # the share of peak the compute time is quoted at (1.0: the roofline)
    usable_fraction: float
    stages: tuple[StagePlan, ...]
    overlap: bool = False       # config.tpu.libtpu_init_args lets collectives overlap compute

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
                 "other", "peak", "fits")]
        for s in self.stages:
            rows.append((s.stage, *(f"{b / GiB:.3g}" for b in (s.params, s.optimizer, s.gradients,
                                                              s.activations + s.loss_head, s.kv_cache, s.prefill,
                                                              s.decode_copy, s.extra + s.forward, s.total)),
                         "yes" if s.total <= self.budget else "NO"))
        text = _columns(rows)
        timed = [s for s in self.stages if s.time]
        if timed:
            times = [("time/step", "TFLOP", "TFLOP/device", f"compute s @{self.mfu:.0%} of peak", "collective s",
                      "step s", "MFU ceiling", "bound by")]
            for s in timed:
                t = s.time
                times.append((s.stage, f"{s.flops / 1e12:.0f}", f"{t.device_flops / 1e12:.1f}", f"{t.compute_s:.2f}",
                              f"{t.collective_s:.2f}", f"{t.step_s:.2f}", f"{t.mfu_ceiling:.0%}",
                              "collectives" if t.collective_bound else "compute"))
            text += "\n\n" + _columns(times)
        notes = [f"  {s.stage}: {n}" for s in self.stages for n in s.notes]
        return head + text + ("\nnotes:\n" + "\n".join(notes) if notes else "") + "\n"

    def check_compiled(self, peaks) -> None:
        """Raises UserError naming the first compiled program whose peak, with what the plan keeps resident beside
        it (StagePlan.resident_beside), is over the budget; `peaks`: (stage, figure, program, compiled bytes)."""
        stages = {s.stage: s for s in self.stages}
        for stage, figure, program, compiled in peaks:
            resident = stages[stage].resident_beside(figure)
            if compiled + resident > self.budget:
                raise UserError(f"{self.config_name}: program {program} compiles to {compiled / GiB:.2f} GiB per "
                                f"device and stage {stage} keeps {resident / GiB:.2f} GiB beside it (optimizer state, a "
                                f"KL reference) but a {self.chip.name} gives {self.budget / GiB:.2f} GiB; shard wider "
                                "(config.mesh.shape), more microbatches, a stronger remat policy, or a larger slice")

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


def _columns(rows) -> str:
    """Returns rows of strings as aligned text columns (the first left-aligned, the rest right-aligned)."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths)))
                     for r in rows)


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
    overlap = overlaps_collectives(config)
    out = [_stage(s, config, model_config, state, mesh, rules, chip, devices, mfu, overlap) for s in stages]
    return Plan(config_name, chip, devices, axes, arch_name, n_params, mfu, usable_fraction, tuple(out), overlap)


def overlaps_collectives(config) -> bool:
    """Returns whether config.tpu.libtpu_init_args turns on async collective fusion (collectives under compute)."""
    options = compiler_options(str(config.tpu.libtpu_init_args))
    return options.get("xla_tpu_enable_async_collective_fusion", "").lower() == "true"


def _splits(model_config, mesh, rules) -> step_time.Splits:
    """Returns how the mesh cuts each kind of work (rows, text and vision weights), as the rules place them."""
    t, v = model_config.text, model_config.vision

    def cut(size, logical):
        return size // memory.local_size(size, logical, mesh, rules)

    return step_time.Splits(rows=mesh.shape["data"] * mesh.shape["fsdp"], tensor=cut(t.num_attention_heads, "q_heads"),
                            data=mesh.shape["data"], fsdp=mesh.shape["fsdp"],
                            vision_embed=cut(v.hidden_size, "vision_embed"),
                            vision_mlp=cut(v.intermediate_size, "vision_mlp"),
                            vision_heads=cut(v.num_heads, "vision_heads"))


def _stage(stage, config, model_config, state, mesh, rules, chip, devices, mfu, overlap) -> StagePlan:
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
    flops = device_flops = step_s = 0.0
    timed = None
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
        flops = train_flops(model_config, tokens=batch * seq_len, seq_len=seq_len, patches=batch * row_patches,
                            images=images)
        extra_forwards = 0
        if stage == "salvage":  # the old-policy log-probs (and a KL reference) are one forward pass each
            extra_forwards = 1 + (config.salvage.loss.kl_beta > 0)
            flops *= (3 + extra_forwards) / 3
        timed = step_time.train_step_time(
            model_config, _splits(model_config, mesh, rules), devices=devices, chip=chip, rows=rows,
            microbatches=micro, seq_len=seq_len, row_patches=row_patches,
            images_per_row=1 + int(config.prompt.history_images), remat_policy=runtime.remat_policy,
            compute_bytes=memory.dtype_bytes(runtime.compute_dtype), param_bytes_per_device=state["params"],
            param_itemsize=memory.dtype_bytes(runtime.param_dtype), extra_forwards=extra_forwards,
            model_flops=flops, overlap=overlap, efficiency=mfu)
        device_flops, step_s = timed.device_flops, timed.step_s
        if row_patches:
            notes.append(f"vision tower: patches replicated, matmuls split by its weights' shards: "
                         f"{timed.vision_flops / timed.device_flops:.0%} of a device's FLOPs")
        how = ("max(compute, weight collectives) + activation all-reduces (the overlap flags are set)" if overlap
               else "compute + all collectives (no overlap flags: config.tpu.libtpu_init_args)")
        notes.append(f"time: compute {timed.compute_s:.2f} s, weight gathers/reductions {timed.overlappable_s:.2f} s "
                     f"({timed.weight_bytes / GiB:.1f} GiB), activation all-reduces {timed.exposed_s:.2f} s "
                     f"({timed.activation_bytes / GiB:.1f} GiB); step = {how}"
                     + ("; collective-bound" if timed.collective_bound else ""))
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
    host_copy = 0
    if stage == "mine" and config.mine.rollouts and devices > chips.HOST_CHIPS:
        host_copy = _host_copy(config, model_config, mesh, rules, chip, notes)
    optimizer = state["optimizer"] if train else 0
    return StagePlan(stage, state["params"], optimizer, sizes["gradients"], sizes["activations"], sizes["kv_cache"],
                     sizes["extra"], flops, step_s, tuple(notes), loss_head=sizes["loss_head"],
                     decode_copy=sizes["decode_copy"], prefill=sizes["prefill"], forward=sizes["forward"],
                     unread=sizes["unread"], device_flops=device_flops, time=timed, host_copy=host_copy)


def _host_copy(config, model_config, mesh, rules, chip, notes: list[str]) -> int:
    """Returns one device's bytes of the policy copy a host samples mine's rollouts with (stages/mine.py): the
    weights in the compute dtype on the mesh models/from_config.py fits to the host's chips, the decode copy
    (in the layout the sampler picks there) and the KV cache of config.collect.workers rows."""
    shape = host_mesh_shape((mesh.shape["data"], mesh.shape["fsdp"], mesh.shape["tensor"]), chips.HOST_CHIPS)
    host = memory.abstract_mesh(dict(zip(("data", "fsdp", "tensor"), shape)))
    copy_config = host_copy_config(config)
    runtime = runtime_from_config(copy_config.model)
    weights = memory.state_bytes(model_config, copy_config, host)["params"]
    layout = sharding.pick_decode_sharding(runtime.decode_sharding, host, memory.decode_copy_bytes(
        model_config, runtime, host, rules, "replicated"), chip.hbm_bytes)
    decode = memory.decode_copy_bytes(model_config, runtime, host, rules, layout)
    prompt = programs.sampling_shapes(config, "mine").prompt_len
    kv = memory.kv_cache_bytes(model_config, runtime, host, sharding.decode_rules(rules, layout),
                               int(config.collect.workers), prompt, int(config.collect.max_new_tokens))
    notes.append(f"rollouts: each host samples its own copy on its {chips.HOST_CHIPS} chips, mesh {shape}, after the "
                 f"global model is released: weights {weights / GiB:.2f} + decode copy {decode / GiB:.2f} + KV "
                 f"{kv / GiB:.2f} GiB per chip")
    return weights + decode + kv


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
        layout = sharding.pick_decode_sharding(
            runtime.decode_sharding, mesh, text_copy * math.prod(mesh.shape.values()), chip.hbm_bytes, chip=chip.name,
            work=sharding.DecodeWork.of(model_config.text, memory.dtype_bytes(runtime.compute_dtype), decode_rows,
                                        bucket, shapes.max_new_tokens, shapes.group_size,
                                        runtime.group_decode == "cascade"))
        sizes["decode_copy"] = memory.decode_copy_bytes(model_config, runtime, mesh, rules, layout)
        # From the first sampled token on, the head is the copy's: the training layout's shard goes unread (pruned).
        sizes["unread"] = state["head"] if layout != "training" else 0
    decode_rules = sharding.decode_rules(rules, layout)
    cascade = shapes.group_size > 1 and runtime.group_decode == "cascade"
    if cascade:
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
    sizes["prefill"] = memory.prefill_bytes(local, runtime, prefill_rows // dp, bucket,
                                            bucket + (0 if cascade else shapes.max_new_tokens), patches)
    notes.append(f"sampling: {real} prompt(s) prefilled as {prefill_rows} rows of {bucket} tokens, {decode_rows} rows "
                 f"x {shapes.max_new_tokens} new tokens decoded")
    if sizes["decode_copy"] and layout != "training":
        notes.append(f"sampling: decode copy of the text weights laid out '{layout}', {sizes['decode_copy'] / GiB:.2f} "
                     f"GiB a device, remade after every weight update: ~{sizes['decode_copy'] / chip.link_bytes_per_s:.2f}"
                     f" s at {chip.link_bytes_per_s / 1e9:.0f} GB/s chip-to-chip (an estimate; the salvage stage logs "
                     "the measured decode_resync_s)")
