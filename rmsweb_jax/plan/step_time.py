"""A train step's time on a slice as the compiled program runs it: per-device FLOPs and collective bytes.

FLOPs per device follow how XLA partitions each matmul (the vision tower's read off the HLO of its v5p
2x2 compile, BUILD.md): a matmul runs split by every mesh axis that shards its tokens or its weight.
Text layers and the LM head: rows over data x fsdp, heads / MLP / vocabulary over tensor, so their
FLOPs divide by all devices. The vision tower's patches are replicated, but each of its matmuls
is cut by its weight's shards (vision_embed over fsdp, vision_mlp / vision_heads over tensor): every
device multiplies its slice of the activations by its slice of the weight and the partial sums are
all-reduced. So its matmuls divide by fsdp x tensor, its attention core only by tensor (heads), and
its activation all-reduces ([patches x width], per matmul) are the price.

Passes: forward 1, backward 2, and the remat policy's recompute: "full" and "save_attention_out" rerun
each layer's (and vision block's) forward (splash's log-sum-exp is not saved, so even its kernel
reruns), "dots*" rerun the attention core only. Salvage-DS adds forward-only passes (old-policy and
reference log-probs).

Collectives per device, by ring (an all-gather or reduce-scatter moves (n-1)/n of the array, an
all-reduce twice that): FSDP gathers each microbatch's weights in the compute dtype for the forward
and again for the backward, and reduce-scatters the gradients; tensor parallelism all-reduces each
text layer's [tokens x hidden] twice a forward pass and twice a backward; a data axis all-reduces the
fp32 gradients once a step. Bandwidth: chips.axis_bytes_per_s.

Step time: weight gathers and gradient reductions depend on no activation, so with the overlap flags
(config.tpu.libtpu_init_args: async collective fusion) XLA runs them under the matmuls and the step is
max(compute, those); activation all-reduces sit between a matmul and the next that reads them, so they
add in any case. Without the flags every collective adds.
"""
from __future__ import annotations

import dataclasses

from rmsweb_jax.plan import chips

FULL_RECOMPUTE = ("full", "save_attention_out")
ATTENTION_RECOMPUTE = ("dots", "dots_with_no_batch_dims")


@dataclasses.dataclass(frozen=True)
class StepTime:
    """One train step on one device: FLOPs, seconds of compute and of collectives, the step and its MFU ceiling."""
    device_flops: float         # the compiled program's FLOPs on one device (recompute and replication included)
    vision_flops: float         # of which the vision tower's
    weight_bytes: float         # FSDP weight gathers + gradient reduce-scatters + data-axis gradient all-reduce
    activation_bytes: float     # tensor-parallel and vision-tower activation all-reduces
    compute_s: float            # device_flops at the given share of peak (1.0: the roofline)
    overlappable_s: float       # the weight collectives' seconds
    exposed_s: float            # the activation collectives' seconds
    overlap: bool               # the overlap flags are set: weight collectives hide under compute
    model_flops: float          # the model's FLOPs of the step, all devices (train/metrics.py train_flops)
    devices: int
    peak_flops: float

    @property
    def collective_s(self) -> float:
        return self.overlappable_s + self.exposed_s

    @property
    def step_s(self) -> float:
        """Returns the step's estimate: max(compute, weight collectives) + activation collectives with the overlap
        flags, the sum of all three without (module docstring)."""
        if self.overlap:
            return max(self.compute_s, self.overlappable_s) + self.exposed_s
        return self.compute_s + self.overlappable_s + self.exposed_s

    @property
    def mfu_ceiling(self) -> float:
        """Returns model FLOPs / (devices x peak x step time): the MFU the step reaches at best."""
        return self.model_flops / (self.devices * self.peak_flops * self.step_s)

    @property
    def collective_bound(self) -> bool:
        return self.collective_s > self.compute_s


@dataclasses.dataclass(frozen=True)
class Splits:
    """How many ways each kind of work is cut on a device (1: whole), from the mesh and the sharding rules."""
    rows: int                   # data x fsdp, when the microbatch's rows divide over them
    tensor: int                 # text heads / MLP / vocabulary
    data: int
    fsdp: int
    vision_embed: int           # the vision tower's hidden size (its matmuls' contraction or output)
    vision_mlp: int
    vision_heads: int


def train_step_time(model_config, splits: Splits, *, devices: int, chip: chips.Chip, rows: int, microbatches: int,
                    seq_len: int, row_patches: int, images_per_row: int, remat_policy: str, compute_bytes: int,
                    param_bytes_per_device: int, param_itemsize: int, extra_forwards: int, model_flops: float,
                    overlap: bool, efficiency: float = 1.0) -> StepTime:
    """Returns the StepTime of a train step of `microbatches` x `rows` rows of `seq_len` tokens and `row_patches`
    image patches (`images_per_row` images) per row; `extra_forwards` forward-only passes beside it."""
    t, v = model_config.text, model_config.vision
    d, hd = t.hidden_size, t.head_dim
    forward_passes = 1 + extra_forwards
    full = remat_policy in FULL_RECOMPUTE
    attention_again = full or remat_policy in ATTENTION_RECOMPUTE

    # Text, per token of one forward pass (all devices together).
    matmuls = 2 * d * hd * (2 * t.num_attention_heads + 2 * t.num_key_value_heads) + 2 * 3 * d * t.intermediate_size
    attention = 2 * 2 * seq_len * hd * t.num_attention_heads / 2  # causal: half the row on average
    head = 2 * d * t.vocab_size
    tokens = rows * microbatches * seq_len
    layer_passes = 3 + forward_passes - 1  # forward, backward (2), the extra forwards
    text = tokens * (t.num_hidden_layers * ((layer_passes + full) * matmuls
                                            + (layer_passes + attention_again) * attention)
                     + (layer_passes) * head)
    text_device = text / devices

    # Vision tower, per patch of one forward pass; its patches are the same on every device.
    vision_device = 0.0
    patches = rows * microbatches * row_patches
    per_image = row_patches / max(images_per_row, 1)
    dv = v.hidden_size
    if patches:
        block_matmuls = 2 * (4 * dv * dv + 2 * dv * v.intermediate_size)
        block_attention = 2 * 2 * per_image * dv
        merged = patches / v.spatial_merge_size ** 2 * (1 + len(v.deepstack_visual_indexes)) * 2 * (
            v.merged_hidden_size ** 2 + v.merged_hidden_size * v.out_hidden_size)
        weight_split = splits.vision_embed * max(splits.vision_mlp, splits.vision_heads)
        vision_device = (patches * v.depth * ((layer_passes + full) * block_matmuls / weight_split
                                              + (layer_passes + attention_again) * block_attention
                                              / splits.vision_heads)
                         + layer_passes * (patches * 2 * v.patch_dim * dv / splits.vision_embed
                                           + merged / weight_split))

    # Collectives, bytes one device moves.
    cb = compute_bytes
    weights_tensor_shard = param_bytes_per_device * splits.fsdp * cb / param_itemsize
    f = splits.fsdp
    gathers = microbatches * (2 + extra_forwards) + microbatches  # forward + backward gathers, gradient scatters
    weight = gathers * weights_tensor_shard * (f - 1) / f
    data_bytes = 2 * (splits.data - 1) / splits.data * param_bytes_per_device
    local_tokens = rows * seq_len / splits.rows
    tensor_passes = 4 + 2 * full + 2 * extra_forwards  # 2 all-reduces a forward, 2 a backward
    tp = splits.tensor
    tensor_bytes = (microbatches * t.num_hidden_layers * tensor_passes * local_tokens * d * cb * 2 * (tp - 1) / tp)
    vision_fsdp = vision_tensor = 0.0
    if patches:
        mb_patches = rows * row_patches
        vision_passes = microbatches * v.depth * (2 + full + extra_forwards)  # the backward mirrors the forward
        fe, tm, th = splits.vision_embed, splits.vision_mlp, splits.vision_heads
        if fe > 1:  # q/k/v and MLP-up contract over the sharded hidden size: partial sums over fsdp
            vision_fsdp = vision_passes * mb_patches * (3 * dv / th + v.intermediate_size / tm) * cb * 2 * (fe - 1) / fe
        if max(tm, th) > 1:  # the output projection and MLP-down contract over heads / MLP width
            tv = max(tm, th)
            vision_tensor = vision_passes * mb_patches * 2 * dv / fe * cb * 2 * (tv - 1) / tv

    def seconds(nbytes, axis):
        return nbytes / chips.axis_bytes_per_s(chip, devices, axis) if nbytes else 0.0

    overlappable = seconds(weight, f) + seconds(data_bytes, splits.data)
    exposed = seconds(tensor_bytes + vision_tensor, tp) + seconds(vision_fsdp, f)
    device_flops = text_device + vision_device
    return StepTime(device_flops, vision_device, weight + data_bytes, tensor_bytes + vision_fsdp + vision_tensor,
                    device_flops / (chip.peak_flops * efficiency), overlappable, exposed, overlap, model_flops,
                    devices, chip.peak_flops)
