"""The model-issue benchmark config (shared by train_step.py and decode.py) and small timing helpers."""
from __future__ import annotations

import os
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

from bench.report import emit  # noqa: E402,F401  (the closing JSON line)

VOCAB = 32_000
IMAGE_TOKEN, VISION_START, VISION_END = 31_990, 31_988, 31_989


def hf_bench_config():
    """Returns the transformers Qwen3VLConfig of the bench: text 4x512 (8 q / 4 kv heads, hd 64, MLP 1536,
    vocab 32k); vision 2 x 256 with DeepStack on 2 layers."""
    from transformers import Qwen3VLConfig
    text = dict(vocab_size=VOCAB, hidden_size=512, intermediate_size=1536, num_hidden_layers=4,
                num_attention_heads=8, num_key_value_heads=4, head_dim=64, max_position_embeddings=8192,
                rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0, "mrope_section": [16, 8, 8],
                                 "mrope_interleaved": True})
    vision = dict(depth=2, hidden_size=256, intermediate_size=1024, num_heads=4, out_hidden_size=512,
                  num_position_embeddings=2304, deepstack_visual_indexes=[0, 1], patch_size=16,
                  spatial_merge_size=2, temporal_patch_size=2)
    return Qwen3VLConfig(text_config=text, vision_config=vision, image_token_id=IMAGE_TOKEN,
                         vision_start_token_id=VISION_START, vision_end_token_id=VISION_END,
                         tie_word_embeddings=False)


def write_bench_checkpoint(directory, seed: int = 0):
    """Saves a random bench-config model with transformers and returns it (fp32, train mode off)."""
    import torch
    from transformers import Qwen3VLForConditionalGeneration
    torch.manual_seed(seed)
    model = Qwen3VLForConditionalGeneration(hf_bench_config()).float()
    model.save_pretrained(directory)
    return model


def image_batch(rng: np.random.Generator, batch: int, length: int, grid=(1, 8, 8)):
    """Returns (input_ids [B, L], pixel_values, image_grid_thw): one image (a 128x128 crop) per row."""
    t, h, w = grid
    n_img = t * h * w // 4
    ids = rng.integers(10, 30_000, (batch, length)).astype(np.int64)
    ids[:, 4] = VISION_START
    ids[:, 5:5 + n_img] = IMAGE_TOKEN
    ids[:, 5 + n_img] = VISION_END
    pixels = rng.standard_normal((batch * t * h * w, 1536)).astype(np.float32)
    return ids, pixels, np.array([grid] * batch, np.int64)


def peak_matmul_gflops(seconds: float = 2.0, n: int = 2048) -> float:
    """Returns the best fp32 matmul GFLOP/s of jax on this machine (the MFU denominator)."""
    from rmsweb_jax.train.metrics import measured_matmul_flops
    return measured_matmul_flops(n, seconds) / 1e9


def interleaved(runs: dict, steps: int) -> dict:
    """Returns {name: median seconds per step}, timing the named steps alternately (load drifts hit both)."""
    times = {name: [] for name in runs}
    for _ in range(steps):
        for name, run in runs.items():
            start = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - start)
    return {name: float(np.median(t)) for name, t in times.items()}
