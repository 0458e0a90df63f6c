"""Qwen3-VL-32B-Instruct from a local checkpoint: the 8B setup with FSDP x 4-way tensor parallel.

    python -m rmsweb_jax.main --config=configs/qwen3_vl_32b.py \
        --config.model.init=hf:/data/Qwen3-VL-32B-Instruct --workdir=/tmp/run32b
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repo root, for configs.*
from configs import qwen3_vl_8b  # noqa: E402


def get_config(arg=None):
    c = qwen3_vl_8b.get_config(arg)
    c.model.init = "hf:/path/to/Qwen3-VL-32B-Instruct"
    c.mesh.shape = (1, -1, 4)  # 64 heads / 8 KV heads split 4 ways; FSDP over the rest
    return c
