"""SFT of Qwen3-VL-8B-Instruct on a TPU slice: `--config=configs/qwen3_vl_8b_sft.py:v5p` (default) or `:v6e`.

    python -m rmsweb_jax.plan --config=configs/qwen3_vl_8b_sft.py:v6e        # the memory plan, no devices
    python -m rmsweb_jax.main --config=configs/qwen3_vl_8b_sft.py:v5p \
        --config.model.init=hf:/data/Qwen3-VL-8B-Instruct --workdir=/mnt/bucket/run8b

Architecture (models/qwen3_vl/config.py preset '8b'), as in Qwen/Qwen3-VL-8B-Instruct's config.json on
the Hugging Face Hub: text hidden 4096, 36 layers, 32 query / 8 KV heads of 128, MLP 12288, vocabulary
151936, untied head; vision tower 27 blocks of 1152 (MLP 4304, 16 heads), patch 16, merge 2, out 4096.
8.77 B parameters. Layout choices: configs/pod_slices.py.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repo root, for configs.*
from configs import pod_slices, qwen3_vl_8b  # noqa: E402
from configs.pod_slices import Slice  # noqa: E402

SLICES = {
    # v5p-64 = 32 chips of 95 GB. fsdp 16 x tensor 2: the fp32 state (16 bytes a parameter, 140 GB) is
    # 4 GB a chip; 64 rows of 8192 tokens (0.5 M tokens a step) in 4 microbatches of 16 rows, 1 a chip,
    # two screenshots a row. Saving attention outputs recomputes the cheap part of each layer only.
    "v5p": Slice("v5p-64", (1, -1, 2), 64, 4, "save_attention_out", 1),
    # v6e-64 = 64 chips of 32 GB. tensor 8 (32 / 8 heads split 4 / 1) leaves fsdp 8: microbatches of 8
    # rows; one screenshot a row keeps the replicated vision tower inside 32 GB. The planner's proposal
    # (plan/meshes.py): FSDP alone or tensor 2 / 4 need 64 / 32 / 16 rows a microbatch, over 32 GB.
    "v6e": Slice("v6e-64", (1, -1, 8), 64, 8, "save_attention_out", 0),
}


def get_config(arg=None):
    c = qwen3_vl_8b.get_config()
    c.stages = ("sft",)
    return pod_slices.apply(c, pod_slices.pick(SLICES, arg, "qwen3_vl_8b_sft"), "8b")
