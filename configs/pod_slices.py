"""The shared shape of the 8B / 32B pod-slice presets (qwen3_vl_{8b,32b}_{sft,salvage}.py): a Slice per TPU
slice, applied to a stage config. Each preset's SLICES table says why its numbers are what they are; every
one is checked by the planner in tests/test_plan.py (`python -m rmsweb_jax.plan --config=<preset>:<slice>`).

Why the vision settings weigh so much: the trainer runs the vision tower replicated on every device over
ALL image patches of a microbatch (train/batch.py `batch_shardings`), so its activations are divided by
no mesh axis. A microbatch's rows must still divide over data x fsdp, so the presets keep data x fsdp
small (tensor parallelism over the rest) and use several microbatches: fewer rows, fewer patches at once.
"""
import dataclasses

import ml_collections


# libtpu flags that let XLA run collectives under compute (async collective fusion: FSDP weight gathers prefetched
# beneath the previous layer's matmuls), as MaxText sets them (AI-Hypercomputer/maxtext, benchmarks/
# xla_flags_library.py): v5p as its configs/tpu/v5p/llama2_7b.sh exports LIBTPU_INIT_ARGS; v6e as its
# maxtext_trillium_model_configs.py llama3_8b_8192 / llama3_1_8b_8192 (DENSE_VMEM_LIMIT_FLAG + CF_FOR_ALL_GATHER
# + DATA_PARALLEL_OVERLAP).
_ASYNC_ALL_GATHER = ("--xla_tpu_enable_async_collective_fusion=true "
                     "--xla_tpu_enable_async_collective_fusion_fuse_all_gather=true "
                     "--xla_tpu_enable_async_collective_fusion_multiple_steps=true "
                     "--xla_tpu_overlap_compute_collective_tc=true --xla_enable_async_all_gather=true")
_DATA_PARALLEL_OVERLAP = ("--xla_tpu_enable_data_parallel_all_reduce_opt=true "
                          "--xla_tpu_data_parallel_opt_different_sized_ops=true")
LIBTPU_FLAGS = {
    "v5p": f"{_ASYNC_ALL_GATHER} {_DATA_PARALLEL_OVERLAP} --xla_tpu_megacore_fusion_allow_ags=false "
           "--xla_enable_async_collective_permute=true --xla_tpu_enable_ag_backward_pipelining=true",
    "v6e": f"--xla_tpu_scoped_vmem_limit_kib=98304 {_ASYNC_ALL_GATHER} {_DATA_PARALLEL_OVERLAP}",
}


@dataclasses.dataclass(frozen=True)
class Slice:
    topology: str          # e.g. 'v5p-64' (v5p names count TensorCores: 32 chips) or 'v6e-64' (64 chips)
    mesh: tuple            # (data, fsdp, tensor); -1 takes the rest
    batch_size: int        # global rows per step
    microbatches: int
    remat_policy: str
    history_images: int    # screenshots of earlier steps in a prompt (each ~3520 patches at 1280x720)
    max_tokens: int = 8192  # the longest row (bucket); a shorter one is half of it


def apply(c: ml_collections.ConfigDict, s: Slice, architecture: str) -> ml_collections.ConfigDict:
    """Returns `c` with the slice's layout, bf16 compute over fp32 master weights, the chip's libtpu flags and its
    plan block."""
    c.model.param_dtype = "float32"       # master weights and AdamW moments in fp32: a 1e-5 step vanishes in bf16
    c.model.compute_dtype = "bfloat16"    # the MXU's native input; logits and losses stay fp32
    c.model.remat_policy = s.remat_policy
    c.model.scan_layers = True            # 36 / 64 layers: one compiled layer body
    c.mesh.shape = s.mesh
    c.train.batch_size = s.batch_size
    c.train.microbatches = s.microbatches
    c.prompt.history_images = s.history_images
    patches = 4096 * (1 + s.history_images)  # 1280x720 -> 80 x 44 patches of 16 = 3520 per image, rounded up
    # Rows: the images' tokens (patches / 4 after the 2x2 merge) + ~2k of text, thought and tool call.
    c.data.buckets = (s.max_tokens // 2, s.max_tokens)
    c.data.bucket_patches = (patches, patches)
    c.tpu.libtpu_init_args = LIBTPU_FLAGS[s.topology.split("-")[0]]
    c.plan = ml_collections.ConfigDict()
    c.plan.chip = s.topology.split("-")[0]  # the slice `python -m rmsweb_jax.plan` sizes this preset for
    c.plan.topology = s.topology
    c.plan.architecture = architecture    # read when model.init's checkpoint is not on the planning machine
    return c


def pick(slices: dict, arg, preset: str) -> Slice:
    """Returns slices[arg] (default: the first), or raises naming the preset and the known slices."""
    name = arg or next(iter(slices))
    if name not in slices:
        raise ValueError(f"configs/{preset}.py:{name}: unknown slice; expected one of {sorted(slices)}")
    return slices[name]


def salvage_on_sft_layout(c: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """Returns the SFT preset `c` turned into its mine + Salvage-DS preset (same slice layout: the trainer
    and the sampler share the mesh; the planner sizes the train step and the KV cache, never together)."""
    c.stages = ("mine", "salvage")
    # G = 8 samples a state (contrast needs both outcomes in a group); 6 accepted groups = 48 policy rows,
    # leaving 16 of the 64-row batch for anchor rows of rejected groups (salvage/batches.py fills the room).
    c.salvage.group_size = 8
    c.salvage.groups_per_step = 6
    c.salvage.max_draws_per_step = 24     # 4 x the groups wanted: about a quarter of critical states pass the gates
    # Sampler calls of 64 rows (8 states x G): rows divide over data x fsdp, so the KV cache shards by row.
    c.salvage.sample_batch = 64
    c.salvage.max_new_tokens = 256        # a thought + one tool call; the prompt keeps the rest of the row
    c.salvage.loss.kl_beta = 0.0          # no frozen reference copy (DAPO-style): 1 parameter set in HBM
    c.mine.samples = 8
    c.mine.batch_states = 8
    c.mine.max_batch = 64
    c.mine.max_new_tokens = 256
    return c
