"""Failure-mode mining + Salvage-DS of an SFT'd Qwen3-VL-8B on a TPU slice:
`--config=configs/qwen3_vl_8b_salvage.py:v5p` (default) or `:v6e`.

    python -m rmsweb_jax.plan --config=configs/qwen3_vl_8b_salvage.py:v5p
    python -m rmsweb_jax.main --config=configs/qwen3_vl_8b_salvage.py:v5p --workdir=/mnt/bucket/run8b

Runs `mine` then `salvage` in a workdir whose `sft` stage ran (configs/qwen3_vl_8b_sft.py, same slice):
both start from <workdir>/sft/hf. The slice layout is the SFT preset's (the trainer and the sampler share
the mesh); the planner sizes the train step and the sampler's KV cache, which never coexist.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repo root, for configs.*
from configs import pod_slices, qwen3_vl_8b_sft  # noqa: E402


def get_config(arg=None):
    return pod_slices.salvage_on_sft_layout(qwen3_vl_8b_sft.get_config(arg))
