"""Qwen3-VL-8B-Instruct from a local checkpoint, bf16 compute, FSDP over all devices.

    python -m rmsweb_jax.main --config=configs/qwen3_vl_8b.py \
        --config.model.init=hf:/data/Qwen3-VL-8B-Instruct --workdir=/tmp/run8b
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repo root, for configs.*
from configs.common import base_config  # noqa: E402


def get_config(arg=None):
    c = base_config()
    c.model.init = "hf:/path/to/Qwen3-VL-8B-Instruct"
    c.model.compute_dtype = "bfloat16"
    c.model.param_dtype = "float32"
    c.model.remat_policy = "dots_with_no_batch_dims"
    c.mesh.shape = (1, -1, 1)
    c.smoke.max_pixels = 1280 * 720
    return c
