"""Per-device bytes of one stage of a config on a slice, from abstract shapes alone (nothing is allocated).

Parameters and optimizer state: the trainer's own sharding code (train/step.py `param_shardings`,
`train_state_shardings`) run on a `jax.sharding.AbstractMesh` of the slice's shape, and each leaf's
`shard_shape`. That is exact: the same rules table places the real arrays.

Activations: what the backward pass keeps, found by tracing (never compiling) `jax.vjp` of the
trainer's loss on ONE DEVICE'S SHARE of the step: the rows of a microbatch divided over the batch mesh
axes, and the heads, MLP width and vocabulary divided over the mesh axes the rules give them. The
residuals of that trace (the vjp's saved values that are not its inputs) are exactly what the remat
policy keeps, stacked over the layer scan. XLA's peak inside the step is then
    saved residuals + gradients (the parameters' per-device bytes, in their dtype)
    + with a remat policy, the one layer that the backward pass recomputes at a time
      (that layer's residuals without remat, less what the policy already saved of it).
Checked against `jit(step).lower(...).compile().memory_analysis().temp_size_in_bytes` on 8 CPU
devices (tests/test_plan.py): within 25% for every remat policy in float32 compute. bfloat16 compute on
CPU runs 30-40% above the figure because XLA:CPU widens bf16 elementwise work to f32 temporaries; TPUs
and GPUs compute bf16 natively.

Attention is traced as the target runs it: XLA's on CPU (it saves [T, S] probabilities), splash on
TPU; GPUs' cuDNN attention saves what splash does (output and log-sum-exp), so splash stands in for
it. The vision tower runs replicated on every device over all patches of a microbatch (train/batch.py
`batch_shardings`): its activations are not divided by the mesh.

Sampling (mine, salvage): the KV cache of one generate call, [layers, rows, prompt bucket +
max_new_tokens, KV heads, head_dim] twice, in the compute dtype, rows divided over the batch axes when
they divide, KV heads over theirs; the prefill's temporaries are its attention's [T, S] logits (`prefill_bytes`).
Sampling and the train step do not overlap: the stage's peak is
parameters + optimizer state + max(step temporaries, sampling).
"""
from __future__ import annotations

import dataclasses
import math
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import AbstractMesh

from rmsweb_jax.errors import UserError
from rmsweb_jax.models import qwen3_vl, sharding
from rmsweb_jax.models.from_config import rules_from_config, runtime_from_config
from rmsweb_jax.models.qwen3_vl.layers import DTYPES
from rmsweb_jax.models.qwen3_vl.model import ModelInputs, VisionInputs
from rmsweb_jax.sampling.sampler import DEFAULT_LENGTH_BUCKETS
from rmsweb_jax.train.batch import TrainBatch
from rmsweb_jax.train.loss import make_sft_loss
from rmsweb_jax.train.optimizer import OptimizerConfig, make_optimizer
from rmsweb_jax.train.step import ModelParts, param_shardings, train_state_shardings

TRAIN_STAGES = ("ground", "sft", "salvage", "train_smoke")
SAMPLING_STAGES = ("mine", "salvage")


def mesh_shape(shape, devices: int) -> dict[str, int]:
    """Returns {axis: size} of config.mesh.shape on `devices` devices (-1 takes the rest, as the trainer does)."""
    shape = list(shape)
    if len(shape) != len(sharding.MESH_AXES) or shape.count(-1) > 1:
        raise UserError(f"config.mesh.shape = {tuple(shape)}: expected 3 sizes (data, fsdp, tensor), at most one -1")
    known = math.prod(s for s in shape if s != -1)
    if -1 in shape:
        if devices % known:
            raise UserError(f"config.mesh.shape = {tuple(shape)}: {devices} devices are not divisible by {known}")
        shape[shape.index(-1)] = devices // known
    if math.prod(shape) != devices:
        raise UserError(f"config.mesh.shape = {tuple(shape)} needs {math.prod(shape)} devices; the slice has "
                        f"{devices} (use -1 for one axis to take the rest)")
    return dict(zip(sharding.MESH_AXES, shape))


def abstract_mesh(axes: dict[str, int]) -> AbstractMesh:
    """Returns a device-free mesh of the given axis sizes."""
    return AbstractMesh(tuple(axes.values()), tuple(axes))


def _shard_bytes(x, s) -> int:
    shape = x.shape if s is None else s.shard_shape(x.shape)
    return int(np.prod(shape)) * np.dtype(x.dtype).itemsize


def state_bytes(model_config, config, mesh: AbstractMesh) -> dict[str, int]:
    """Returns per-device bytes {'params', 'text_params', 'head', 'optimizer'} of the train state on `mesh`
    ('head': the untied LM head's, 0 when tied)."""
    runtime, rules = runtime_from_config(config.model), rules_from_config(config)
    parts = ModelParts.split(qwen3_vl.abstract_model(model_config, runtime))
    p_sh = param_shardings(qwen3_vl.abstract_model(model_config, runtime), mesh, rules)
    tx = make_optimizer(OptimizerConfig.from_config(config.train.optimizer))
    shardings = train_state_shardings(parts.params, tx, mesh, p_sh)
    opt = jax.eval_shape(tx.init, parts.params)
    params = sum(jax.tree.leaves(jax.tree.map(_shard_bytes, parts.params, p_sh)))
    text = sum(jax.tree.leaves(jax.tree.map(_shard_bytes, parts.params["text"], p_sh["text"])))
    head = 0 if "lm_head" not in parts.params["text"] else _shard_bytes(parts.params["text"]["lm_head"],
                                                                        p_sh["text"]["lm_head"])
    optimizer = sum(jax.tree.leaves(jax.tree.map(_shard_bytes, opt, shardings.opt_state)))
    return {"params": params, "text_params": text, "head": head, "optimizer": optimizer}


def local_size(size: int, logical: str, mesh: AbstractMesh, rules) -> int:
    """Returns one device's share of a dimension of `size` with logical name `logical` under `rules`."""
    spec = sharding.logical_to_spec((logical,), rules, mesh, (size,))
    axes = () if spec[0] is None else (spec[0],) if isinstance(spec[0], str) else spec[0]
    return size // math.prod(mesh.shape[a] for a in axes)


def local_model_config(model_config, mesh: AbstractMesh, rules):
    """Returns the architecture with heads, MLP width and vocabulary cut to one device's share."""
    t, v = model_config.text, model_config.vision
    heads = local_size(t.num_attention_heads, "q_heads", mesh, rules)
    kv = local_size(t.num_key_value_heads, "kv_heads", mesh, rules)
    if heads % kv:  # grouped heads must stay whole groups on a device
        heads, kv = t.num_attention_heads, t.num_key_value_heads
    text = dataclasses.replace(t, num_attention_heads=heads, num_key_value_heads=kv,
                               intermediate_size=local_size(t.intermediate_size, "mlp", mesh, rules),
                               vocab_size=local_size(t.vocab_size, "vocab", mesh, rules))
    # The vision tower keeps all its heads here (its hidden size fixes head_dim): with tensor parallelism
    # its attention residuals are counted whole, an over-estimate of a few percent of the tower's.
    vision = dataclasses.replace(v, intermediate_size=local_size(v.intermediate_size, "vision_mlp", mesh, rules))
    return dataclasses.replace(model_config, text=text, vision=vision)


def traced_attention_impl(chip_name: str, seq_len: int) -> str:
    """Returns the attention path the trainer takes on the chip (see the module docstring)."""
    if chip_name == "cpu" or seq_len % 128:
        return "xla"
    return "splash"


def residual_bytes(model_config, runtime, rows: int, seq_len: int, patches: int) -> int:
    """Returns the bytes the backward pass keeps for one microbatch of `rows` x `seq_len` tokens (and
    `patches` image patches), traced with jax.vjp over the SFT loss on the local architecture."""
    parts = ModelParts.split(qwen3_vl.abstract_model(model_config, runtime))
    loss = make_sft_loss("chunked")
    i32 = np.int32

    def sds(shape, dtype=i32):
        return jax.ShapeDtypeStruct(shape, dtype)

    vision = None
    if patches:
        vision = VisionInputs(sds((patches, model_config.vision.patch_dim), np.float32), sds((patches, 2)),
                              sds((patches, 4)), sds((patches, 4), np.float32), sds((patches,)))
    inputs = ModelInputs(sds((rows, seq_len)), sds((rows, seq_len)), sds((3, rows, seq_len)), vision, sds((rows,)))
    batch = TrainBatch(inputs, sds((rows, seq_len)), sds((rows, seq_len), np.float32), {})

    def loss_sum(params, mb):
        return loss(nnx.merge(parts.graphdef, nnx.State(params), parts.rest), mb)[0].sum

    jaxpr = jax.make_jaxpr(lambda p, b: jax.vjp(loss_sum, p, b))(parts.params, batch).jaxpr
    inputs_of = set(jaxpr.invars)
    total = 0
    for var in jaxpr.outvars[1:]:  # outvars: the loss, then the residuals the vjp closes over
        if isinstance(var, jax.extend.core.Literal) or var in inputs_of:
            continue
        total += int(np.prod(var.aval.shape)) * np.dtype(var.aval.dtype).itemsize
    return total


# Image patches traced at most: beyond, the vision tower's bytes are scaled linearly (flash-style attention
# keeps O(patches) per block; building splash's mask for 500k patches alone takes minutes).
VISION_TRACE_PATCHES = 2048


def _with_depths(model_config, text_layers: int, vision_depth: int):
    return dataclasses.replace(
        model_config, text=dataclasses.replace(model_config.text, num_hidden_layers=text_layers),
        vision=dataclasses.replace(model_config.vision, depth=vision_depth))


def activation_bytes(model_config, runtime, rows: int, seq_len: int, patches: int) -> int:
    """Returns the per-device activation bytes of one microbatch under runtime.remat_policy: the saved
    residuals of the text decoder and the vision tower, plus with remat the one layer (or vision block) the
    backward pass recomputes at a time (module docstring)."""
    exact = patches <= VISION_TRACE_PATCHES or runtime.attention_impl == "xla"
    traced = patches if exact else VISION_TRACE_PATCHES
    text = residual_bytes(model_config, runtime, rows, seq_len, 0)
    vision = 0
    if patches:
        vision = (residual_bytes(model_config, runtime, rows, seq_len, traced) - text) * patches // traced
    if runtime.remat_policy == "none":
        return text + vision
    n, depth = model_config.text.num_hidden_layers, model_config.vision.depth
    plain = dataclasses.replace(runtime, remat_policy="none")

    def recomputed(fewer, p):  # one layer's (or block's) bytes without remat less what the policy saves of it
        def one(rt):
            return (residual_bytes(model_config, rt, rows, seq_len, p)
                    - residual_bytes(fewer, rt, rows, seq_len, p))
        return max(one(plain) - one(runtime), 0)

    text_layer = recomputed(_with_depths(model_config, n - 1, depth), 0)
    vision_block = 0
    if patches and depth > max(model_config.vision.deepstack_visual_indexes, default=-1) + 1:
        vision_block = recomputed(_with_depths(model_config, n, depth - 1), traced) * patches // traced
    return text + vision + max(text_layer, vision_block)


def forward_bytes(model_config, runtime, rows: int, seq_len: int, patches: int) -> int:
    """Returns the temporaries of a forward pass without gradients or a cache (mining's reference log-probs) for
    `rows` x `seq_len` tokens and `patches` patches: the larger of one text layer's and one vision block's
    intermediates, found as the residuals a layer adds when nothing is rematerialised (a forward keeps only the
    layer it is in), plus the hidden states entering and leaving that layer."""
    plain = dataclasses.replace(runtime, remat_policy="none")
    n, depth = model_config.text.num_hidden_layers, model_config.vision.depth

    def layer(fewer, p):
        return (residual_bytes(model_config, plain, rows, seq_len, p)
                - residual_bytes(fewer, plain, rows, seq_len, p))

    text = layer(_with_depths(model_config, n - 1, depth), 0)
    hidden = 2 * rows * seq_len * model_config.text.hidden_size * dtype_bytes(runtime.compute_dtype)
    return max(text + hidden, _vision_block_bytes(model_config, plain, rows, seq_len, patches))


def _vision_block_bytes(model_config, plain, rows: int, seq_len: int, patches: int) -> int:
    """Returns one vision block's intermediates without remat (`plain`) and the patch states entering and leaving
    it, for `patches` patches (0 when the tower has no block past its deepstack taps to measure)."""
    n, depth = model_config.text.num_hidden_layers, model_config.vision.depth
    if not patches or depth <= max(model_config.vision.deepstack_visual_indexes, default=-1) + 1:
        return 0
    traced = min(patches, VISION_TRACE_PATCHES)
    block = (residual_bytes(model_config, plain, rows, seq_len, traced)
             - residual_bytes(_with_depths(model_config, n, depth - 1), plain, rows, seq_len, traced))
    return block * patches // traced + 2 * patches * model_config.vision.hidden_size * dtype_bytes(plain.compute_dtype)


def prefill_bytes(model_config, runtime, rows: int, seq_len: int, kv_slots: int, patches: int) -> int:
    """Returns the temporaries of the sampler's prefill of `rows` x `seq_len` tokens into a cache of `kv_slots`
    slots (and `patches` patches), on the local architecture: the larger of one text layer's peak and one vision
    block's (forward_bytes). The text layer's peak is its attention: a prefill with a cache passes positions, so it
    takes the XLA path (models/attention.py `_xla`), whose fp32 logits [heads x seq_len, kv_slots] and their
    probabilities in the compute dtype are alive together at the softmax, beside the hidden states entering and
    leaving the layer; the MLP's gate and up [seq_len, mlp] are counted instead when larger."""
    t, item = model_config.text, dtype_bytes(runtime.compute_dtype)
    scores = rows * t.num_attention_heads * seq_len * kv_slots * (4 + item)
    mlp = 2 * rows * seq_len * t.intermediate_size * item
    hidden = 2 * rows * seq_len * t.hidden_size * item
    vision = _vision_block_bytes(model_config, dataclasses.replace(runtime, remat_policy="none"), rows, seq_len,
                                 patches)
    return max(hidden + max(scores, mlp), vision)


def loss_head_bytes(model_config, runtime, mesh: AbstractMesh, rules, *, backward: bool) -> int:
    """Returns the loss path's LM-head buffers on a mesh (kernels/token_logprobs_sharded.py): W gathered over its
    embed axes, [D, V / vocab shards], in the compute dtype, and with `backward` the dW buffer of the same shape."""
    if mesh.size == 1:
        return 0
    t = model_config.text
    one = t.hidden_size * local_size(t.vocab_size, "vocab", mesh, rules) * dtype_bytes(runtime.compute_dtype)
    return one * (2 if backward else 1)


def decode_copy_bytes(model_config, runtime, mesh: AbstractMesh, rules, layout: str) -> int:
    """Returns one device's bytes of the sampler's decode copy of the text weights (sampling/sampler.py) in
    `layout` ('training': none), in the compute dtype."""
    if layout == "training":
        return 0
    decode = sharding.decode_rules(rules, layout)
    text = nnx.state(qwen3_vl.abstract_model(model_config, runtime).text, nnx.Param)
    item = dtype_bytes(runtime.compute_dtype)
    total = 0
    for var in jax.tree.leaves(text, is_leaf=lambda x: isinstance(x, nnx.Variable)):
        spec = sharding.logical_to_spec(var.get_metadata().get("axes"), decode, mesh, var.shape)
        total += int(np.prod(jax.sharding.NamedSharding(mesh, spec).shard_shape(var.shape))) * item
    return total


def prompt_bucket(prompt_len: int) -> int:
    """Returns the sampler's padded prompt length (its smallest length bucket that holds `prompt_len`)."""
    return next((b for b in DEFAULT_LENGTH_BUCKETS if b >= prompt_len), prompt_len)


def kv_cache_bytes(model_config, runtime, mesh: AbstractMesh, rules, rows: int, prompt_len: int,
                   max_new_tokens: int) -> int:
    """Returns one device's bytes of the sampler's KV cache for `rows` rows (sampling/sampler.py `_generate`)."""
    t = model_config.text
    bucket = prompt_bucket(prompt_len)
    local_rows = local_size(rows, "batch", mesh, rules)
    kv = local_size(t.num_key_value_heads, "kv_heads", mesh, rules)
    itemsize = np.dtype(DTYPES[runtime.compute_dtype]).itemsize
    return 2 * t.num_hidden_layers * local_rows * (bucket + max_new_tokens) * kv * t.head_dim * itemsize


def runtime_for(config, chip_name: str, seq_len: int):
    """Returns config.model's RuntimeOptions with the attention path the chip takes."""
    runtime = runtime_from_config(config.model)
    impl = runtime.attention_impl
    if impl in ("auto", "cudnn"):
        impl = traced_attention_impl(chip_name, seq_len)
    return dataclasses.replace(runtime, attention_impl=impl)


def dtype_bytes(name: str) -> int:
    """Returns the item size of a config dtype name."""
    return jnp.dtype(DTYPES[name]).itemsize

