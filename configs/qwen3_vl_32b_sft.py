"""SFT of Qwen3-VL-32B-Instruct on a TPU slice: `--config=configs/qwen3_vl_32b_sft.py:v5p` (default) or `:v6e`.

    python -m rmsweb_jax.plan --config=configs/qwen3_vl_32b_sft.py:v5p
    python -m rmsweb_jax.main --config=configs/qwen3_vl_32b_sft.py:v5p \
        --config.model.init=hf:/data/Qwen3-VL-32B-Instruct --workdir=/mnt/bucket/run32b

Architecture (models/qwen3_vl/config.py preset '32b'), as in Qwen/Qwen3-VL-32B-Instruct's config.json on
the Hugging Face Hub: text hidden 5120, 64 layers, 64 query / 8 KV heads of 128, MLP 25600, vocabulary
151936, untied head; the 8B's vision tower (27 x 1152) with out size 5120. 33.4 B parameters.
Layout choices: configs/pod_slices.py.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repo root, for configs.*
from configs import pod_slices, qwen3_vl_32b  # noqa: E402
from configs.pod_slices import Slice  # noqa: E402

SLICES = {
    # v5p-128 = 64 chips of 95 GB. The fp32 state is 535 GB: over 64 chips 8.4 GB each. tensor 8 (64 / 8
    # heads -> 8 / 1) leaves fsdp 8: 8 microbatches of 8 rows, two screenshots a row. (tensor 4 with
    # microbatches of 16 rows planned within 10% of the budget: too close for a first run.)
    "v5p": Slice("v5p-128", (1, -1, 8), 64, 8, "save_attention_out", 1),
    # v6e-64 = 64 chips of 32 GB: the same tensor 8 / fsdp 8 and 8 microbatches, but one screenshot a row
    # in at most 4096 tokens and full remat: planned at ~96% of the 90% budget, the replicated vision tower
    # being over half of it. A larger v6e slice would not help: more fsdp means more rows per microbatch.
    # The planner's proposal (plan/meshes.py): the only candidate mesh that fits.
    "v6e": Slice("v6e-64", (1, -1, 8), 64, 8, "full", 0, 4096),
}


def get_config(arg=None):
    c = qwen3_vl_32b.get_config()
    c.stages = ("sft",)
    return pod_slices.apply(c, pod_slices.pick(SLICES, arg, "qwen3_vl_32b_sft"), "32b")
