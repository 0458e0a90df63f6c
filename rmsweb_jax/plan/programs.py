"""The programs a stage runs, built from a config on any mesh with abstract inputs: what the planner sizes and
what `python -m rmsweb_jax.plan --compile` (and the tpu_aot tests) compile for a TPU slice.

Each builder calls the code path the stage itself runs (the trainer's `TrainStep`, the Salvage-DS loss,
mining's `logprob_fn`, the sampler's prefill + decode program, the vision tower) on `jax.ShapeDtypeStruct`
inputs that carry the shardings the stage would give them; nothing is allocated. Shapes come from the
config as the stages read it: training rows of the largest data bucket with its image patches, sampler
calls of `mine.max_batch` / `salvage.sample_batch` rows of a prompt bucket + max_new_tokens.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from rmsweb_jax.models import qwen3_vl
from rmsweb_jax.models.from_config import runtime_from_config
from rmsweb_jax.models.qwen3_vl.model import ModelInputs, VisionInputs
from rmsweb_jax.plan.memory import prompt_bucket
from rmsweb_jax.sampling.sampler import Sampler, rollout_params
from rmsweb_jax.stages.train_overrides import with_train_overrides
from rmsweb_jax.train.batch import TrainBatch, batch_shardings
from rmsweb_jax.train.logprobs import logprob_fn
from rmsweb_jax.train.loss import make_sft_loss, resolve_loss_impl
from rmsweb_jax.train.optimizer import make_optimizer
from rmsweb_jax.train.rl_loss import REQUIRED_EXTRAS, RLLossSettings, make_salvage_loss
from rmsweb_jax.train.settings import TrainSettings
from rmsweb_jax.train.step import ModelParts, TrainState, TrainStep, param_shardings, train_state_shardings


@dataclasses.dataclass(frozen=True)
class Program:
    """A jitted function and its abstract arguments: `fn.trace(*args)` is the stage's program."""
    name: str
    fn: Any                    # a jax.jit object
    args: tuple
    notes: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class Shapes:
    """The sizes of a stage's programs, as the stage reads them from the config."""
    rows: int                  # global rows of one microbatch (training) or of one sampler call
    microbatches: int
    seq_len: int               # training row length (the largest data bucket)
    row_patches: int           # image patches per training row
    prompt_len: int            # sampler: the longest prompt (the longest row less the response)
    max_new_tokens: int
    group_size: int            # sampler: rows decoded per prefilled prompt


def train_shapes(config, stage: str) -> Shapes:
    """Returns the training shapes of `stage` ('sft', 'ground', 'salvage', 'train_smoke') under `config`: the
    ground stage trains on SFT's bucketed batches (stages/ground.py), at its own batch size."""
    block = with_train_overrides(config, stage).train  # config.<stage>.train over config.train, if it has one
    micro = int(block.microbatches)
    rows = int(block.batch_size) // micro
    if stage == "train_smoke":
        return Shapes(rows, micro, int(config.train_smoke.seq_len), 0, 0, 0, 1)
    buckets, patches = list(config.data.buckets), list(config.data.bucket_patches)
    i = int(np.argmax(buckets))
    return Shapes(rows, micro, int(buckets[i]), int(patches[i]), 0, 0, 1)


def sampling_shapes(config, stage: str) -> Shapes:
    """Returns the sampler-call shapes of `stage` ('mine', 'salvage'): rows, prompt length, new tokens, G."""
    block = config.salvage if stage == "salvage" else config.mine
    group = int(block.group_size if stage == "salvage" else block.samples)
    rows = int(block.sample_batch if stage == "salvage" else block.max_batch)
    max_new = int(block.max_new_tokens)
    prompt = max(max(int(b) for b in config.data.buckets) - max_new, 1)
    return Shapes(max(rows, group), 1, 0, 0, prompt, max_new, group)


def _sds(shape, dtype, sharding=None) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(tuple(shape), dtype, sharding=sharding)


def _abstract_params(model, mesh, rules):
    """Returns (ModelParts with ShapeDtypeStruct params carrying their shardings, the params' shardings)."""
    parts = ModelParts.split(model)
    p_sh = param_shardings(model, mesh, rules)
    params = jax.tree.map(lambda x, s: _sds(x.shape, x.dtype, s), parts.params, p_sh)
    return parts._replace(params=params), p_sh


def vision_inputs(model_config, patches: int, lead: tuple[int, ...] = (), sharding=None) -> VisionInputs:
    """Returns abstract VisionInputs of `patches` patch rows (led by `lead`, e.g. the microbatch axis)."""
    i32, f32 = np.int32, np.float32
    return VisionInputs(_sds(lead + (patches, model_config.vision.patch_dim), f32, sharding),
                        _sds(lead + (patches, 2), i32, sharding), _sds(lead + (patches, 4), i32, sharding),
                        _sds(lead + (patches, 4), f32, sharding), _sds(lead + (patches,), i32, sharding))


def train_batch(model_config, shapes: Shapes, mesh, rules, extras: tuple[str, ...] = ()) -> TrainBatch:
    """Returns an abstract TrainBatch [M, rows, L] placed as the trainer places it (train/batch.py)."""
    m, b, length = shapes.microbatches, shapes.rows, shapes.seq_len
    i32, f32 = np.int32, np.float32
    vision = None
    if shapes.row_patches:
        merge = model_config.vision.spatial_merge_size ** 2
        patches = -(-b * shapes.row_patches // merge) * merge
        vision = vision_inputs(model_config, patches, (m,))
    extra = {k: _sds((m, b, length) if k.startswith("token_") else (m, b), f32) for k in extras}
    batch = TrainBatch(ModelInputs(_sds((m, b, length), i32), _sds((m, b, length), i32),
                                   _sds((m, 3, b, length), i32), vision, _sds((m, b), i32)),
                       _sds((m, b, length), i32), _sds((m, b, length), f32), extra)
    shardings = batch_shardings(batch, mesh, rules)
    if shardings is None:
        return batch
    return jax.tree.map(lambda x, s: _sds(x.shape, x.dtype, s), batch, shardings)


def train_step(config, model_config, mesh, rules, stage: str = "sft") -> Program:
    """Returns the trainer's jitted step (SFT loss, also the ground stage's, or Salvage-DS's for stage 'salvage')
    on abstract inputs."""
    block = with_train_overrides(config, stage)
    settings = TrainSettings.from_config(block.train)
    model = qwen3_vl.abstract_model(model_config, runtime_from_config(config.model), mesh=mesh, rules=rules)
    parts, p_sh = _abstract_params(model, mesh, rules)
    tx = make_optimizer(settings.optimizer)
    st_sh = train_state_shardings(parts.params, tx, mesh, p_sh)
    impl = resolve_loss_impl(settings.loss_impl, mesh)
    if stage == "salvage":
        loss_fn, extras = make_salvage_loss(RLLossSettings.from_config(config.salvage.loss), impl), REQUIRED_EXTRAS
        if config.salvage.loss.kl_beta > 0:
            extras = extras + ("token_ref_logprobs",)
    else:
        loss_fn, extras = make_sft_loss(impl), ()
    step = TrainStep(parts, loss_fn, tx, mesh=mesh, rules=rules, p_shardings=p_sh, shardings=st_sh)
    opt = jax.eval_shape(tx.init, parts.params)
    replicated = None if mesh is None else NamedSharding(mesh, PartitionSpec())
    state = TrainState(_sds((), np.int32, replicated), parts.params,
                       jax.tree.map(lambda x, s: _sds(x.shape, x.dtype, s), opt, st_sh.opt_state),
                       _sds((2,), np.uint32, replicated))
    batch = train_batch(model_config, train_shapes(config, stage), mesh, rules, tuple(extras))
    return Program(f"{stage}_step", step.jitted(batch), (state, batch), (f"loss impl {impl}",))


def reference_logprobs(config, model_config, mesh, rules) -> Program:
    """Returns mining's reference log-prob forward (train/logprobs.py) over `mine.batch_states` rows."""
    model = qwen3_vl.abstract_model(model_config, runtime_from_config(config.model), mesh=mesh, rules=rules)
    parts, _ = _abstract_params(model, mesh, rules)
    dp = 1 if mesh is None else mesh.shape["data"] * mesh.shape["fsdp"]
    rows = -(-int(config.mine.batch_states) // dp) * dp  # padded to whole rows per device (mining/replay.py)
    shapes = dataclasses.replace(train_shapes(config, "sft"), rows=rows, microbatches=1)
    batch = train_batch(model_config, shapes, mesh, rules)
    return Program("mine_logprobs", jax.jit(logprob_fn(parts)), (parts.params, batch))


def sampler_generate(config, model_config, mesh, rules, stage: str = "mine", device_bytes: int | None = None
                     ) -> Program:
    """Returns the sampler's prefill + decode program for one call of `stage` ('mine' or 'salvage'): P prompts
    of the prompt bucket (with the rows' image patches), G samples each, max_new_tokens new tokens."""
    shapes = sampling_shapes(config, stage)
    model = qwen3_vl.abstract_model(model_config, runtime_from_config(config.model), mesh=mesh, rules=rules)
    sampler = Sampler(model, abstract=True, device_bytes=device_bytes)
    real = max(shapes.rows // shapes.group_size, 1)
    prompts = real + -real % sampler.batch_shards  # the sampler pads its prefill rows so (sampling/sampler.py)
    row_patches = train_shapes(config, "sft").row_patches
    length = prompt_bucket(shapes.prompt_len)
    i32 = np.int32
    vision = None
    if row_patches:
        merge = model_config.vision.spatial_merge_size ** 2
        vision = vision_inputs(model_config, -(-real * row_patches // merge) * merge)  # padding rows: no image
    inputs = ModelInputs(_sds((prompts, length), i32), _sds((prompts, length), i32), _sds((3, prompts, length), i32),
                         vision, _sds((prompts,), i32))
    params = rollout_params(model_config, shapes.max_new_tokens, temperature=1.0)  # as both stages sample
    fn, args = sampler.abstract_program(inputs, shapes.group_size, params, real=real)
    return Program(f"{stage}_generate", fn, args,
                   (f"{real} prompt(s) (prefill {prompts} rows) x {length} tokens, G = {shapes.group_size}, {shapes.max_new_tokens} new, "
                    f"decode sharding {sampler.decode_sharding}",))


def vision_tower(config, model_config, mesh, rules, images: int, patches_per_image: int) -> Program:
    """Returns the vision tower's forward over `images` images of `patches_per_image` patches each."""
    model = qwen3_vl.abstract_model(model_config, runtime_from_config(config.model), mesh=mesh, rules=rules)
    parts, _ = _abstract_params(model, mesh, rules)
    replicated = None if mesh is None else NamedSharding(mesh, PartitionSpec())
    vision = vision_inputs(model_config, images * patches_per_image, sharding=replicated)

    def forward(params, v: VisionInputs):
        merged, deepstack = parts.merge(params).visual(*v)
        return merged if deepstack is None else (merged, deepstack)

    return Program(f"vision_{images}_images", jax.jit(forward), (parts.params, vision))
