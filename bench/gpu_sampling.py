"""Group sampling on one GPU against transformers `generate` and against the memory-bandwidth floor (issue 28).

For when a GPU is at hand (jax with CUDA, torch with CUDA, transformers); not for CI. Model: the published
Qwen3-VL-2B-Instruct shape (bench/gpu_train_step.py `qwen3_vl_2b`) with random weights, bf16 parameters and
compute on both sides. The state: a 2,048-token prompt with one 448x448 image, 128 new tokens, temperature 1,
no top-k / top-p, no stop token; 1 and 8 prompts x G = 8 samples each.

  ours: `Sampler.generate_groups`, cascade group decoding (one prompt KV cache per group) and the old copy path;
  anchor: transformers `generate(num_return_sequences=G, do_sample=True)`, same weights (written with `to_hf`).

Each side's decode phase is its time with 128 new tokens less its time with 1 (prefill and first draw only). The
bandwidth floor of one decode step is the bytes it must read (the text weights once, the KV cache: the prompt's
once per group with cascade, once per row for the copy path and transformers, plus the rows' own tokens, half of
them on average) over the device-to-device copy bandwidth measured in the same run; ours is reported as the floor
over the measured step (1.0 = at the floor). Peak device memory of both sides: JAX's peak_bytes_in_use (after our
runs) and torch's max_memory_allocated. --cpu-dry-run: the tiny test config on CPU (checks the script only).
Ends with one JSON line: ours = cascade new tokens/s at 8 prompts x G, anchor = transformers'.

    python bench/gpu_sampling.py [--cpu-dry-run]
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402

from bench.report import emit  # noqa: E402

GOAL = 5.0  # ours / transformers new tokens/s at 8 prompts x G = 8, at least (and >= 50% of the floor)


def copy_bandwidth(n_bytes: int, repeats: int = 10) -> float:
    """Returns device copy bandwidth in bytes/s (read + write) from jitted copies of an n_bytes array."""
    import jax
    import jax.numpy as jnp
    x = jnp.zeros((n_bytes // 4,), jnp.float32)
    f = jax.jit(lambda a: a + 1.0)
    f(x).block_until_ready()
    start = time.perf_counter()
    for _ in range(repeats):
        x = f(x)
    x.block_until_ready()
    return 2 * n_bytes * repeats / (time.perf_counter() - start)


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def floor_step_bytes(cfg, weights_bytes: int, prompts: int, group: int, prompt_len: int, new: int, itemsize: int,
                     shared_prefix: bool) -> float:
    """Returns the bytes one decode step must read: the text weights once and the KV cache, the prompt's once per
    group (`shared_prefix`) or once per row, plus the rows' own tokens (new / 2 on average)."""
    t = cfg.text
    per_token = 2 * t.num_hidden_layers * t.num_key_value_heads * t.head_dim * itemsize
    prompt_reads = prompts if shared_prefix else prompts * group
    return weights_bytes + per_token * (prompt_reads * prompt_len + prompts * group * new / 2)


def with_group_decode(model, path: str):
    """Returns a model with `model`'s parameter arrays (shared, not copied) and runtime.group_decode = path."""
    return with_runtime(model, group_decode=path)


def with_runtime(model, **changes):
    """Returns a model with `model`'s parameter arrays (shared, not copied) and its runtime options changed."""
    from flax import nnx
    from rmsweb_jax.models.qwen3_vl import abstract_model
    twin = abstract_model(model.config, dataclasses.replace(model.runtime, **changes))
    nnx.update(twin, nnx.state(model))
    return twin


def bench_ours(model, ids, pixels, grid, group: int, new: int, repeats: int) -> dict:
    """Returns {path: (seconds with `new` tokens, seconds with 1)} for the cascade and copy group decodes."""
    import jax
    from rmsweb_jax.sampling.sampler import Sampler, SamplingParams
    prompts = [row.tolist() for row in ids]
    out = {}
    for path in ("cascade", "copy"):
        sampler = Sampler(with_group_decode(model, path), length_buckets=(ids.shape[1],),
                          patch_bucket=pixels.shape[0])
        times = []
        for n in (new, 1):
            params = SamplingParams(max_new_tokens=n, temperature=1.0)

            def run(seed, params=params):
                jax.block_until_ready(sampler.generate_groups(prompts, group, params, pixel_values=pixels,
                                                              image_grid_thw=grid, seed=seed))
            run(0)  # compile
            times.append(float(np.median([timed(lambda s=s: run(s)) for s in range(1, repeats + 1)])))
        out[path] = tuple(times)
    return out


def bench_hf(directory, ids, pixels, grid, image_token: int, group: int, new: int, repeats: int, device: str):
    """Returns (seconds with `new` tokens, seconds with 1, peak bytes) of transformers' generate."""
    import torch
    from transformers import Qwen3VLForConditionalGeneration
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    model = Qwen3VLForConditionalGeneration.from_pretrained(directory, dtype=dtype).to(device).eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    kw = dict(input_ids=torch.from_numpy(ids).to(device), attention_mask=torch.ones(ids.shape, dtype=torch.long,
                                                                                     device=device),
              pixel_values=torch.from_numpy(pixels).to(device, dtype), image_grid_thw=torch.from_numpy(grid).to(device),
              mm_token_type_ids=torch.from_numpy((ids == image_token).astype(np.int64)).to(device),
              do_sample=True, temperature=1.0, top_k=0, top_p=1.0, num_return_sequences=group)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    times = []
    for n in (new, 1):
        def run(n=n):
            with torch.no_grad():
                model.generate(**kw, max_new_tokens=n, min_new_tokens=n)
            sync()
        run()
        times.append(float(np.median([timed(run) for _ in range(repeats)])))
    peak = torch.cuda.max_memory_allocated() if device == "cuda" else 0
    del model
    if device == "cuda":
        torch.cuda.empty_cache()
    return times[0], times[1], peak


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cpu-dry-run", action="store_true", help="the tiny config on CPU: checks the script only")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    if args.cpu_dry_run:
        os.environ["JAX_PLATFORMS"] = "cpu"
    import jax
    from gpu_train_step import batch_inputs, qwen3_vl_2b
    from rmsweb_jax.models.qwen3_vl import RuntimeOptions, create, tiny
    from rmsweb_jax.models.qwen3_vl import decode
    from rmsweb_jax.models.qwen3_vl.params import to_hf

    on_gpu = jax.default_backend() == "gpu"
    if not on_gpu and not args.cpu_dry_run:
        print("no GPU: nothing to measure (use --cpu-dry-run to check the script on CPU)")
        emit("gpu_sampling", None, None, "new tokens/s", GOAL)
        return
    if args.cpu_dry_run:
        cfg = tiny(vocab_size=512)
        cfg = dataclasses.replace(cfg, vision=dataclasses.replace(cfg.vision, num_position_embeddings=64))
        length, side, new, group, cases, repeats, dtype = 96, 64, 4, 2, (1, 2), 1, "float32"
    else:
        cfg, length, side, new, group, cases, repeats, dtype = qwen3_vl_2b(), 2048, 448, 128, 8, (1, 8), \
            args.repeats, "bfloat16"
    runtime = RuntimeOptions(param_dtype=dtype, compute_dtype=dtype)
    model = create(cfg, runtime)
    itemsize = np.dtype(dtype).itemsize if dtype == "float32" else 2
    weights = decode.copy_bytes(model.text)
    bandwidth = copy_bandwidth(1 << (24 if args.cpu_dry_run else 30))
    device = jax.devices()[0]
    print(f"device {device.device_kind}; copy bandwidth {bandwidth / 1e9:.1f} GB/s; text weights read per step "
          f"{weights / 1e9:.2f} GB; {length}-token prompt with one {side}x{side} image, G={group}, {new} new tokens",
          flush=True)
    results = {}
    with tempfile.TemporaryDirectory() as d:
        to_hf(model, d)
        for prompts in cases:
            ids, pixels, grid = batch_inputs(cfg, prompts, length, side, seed=prompts)
            rows = prompts * group
            hf_new, hf_one, hf_peak = bench_hf(d, ids, pixels, grid, cfg.image_token_id, group, new, repeats,
                                               "cuda" if on_gpu else "cpu")
            ours = bench_ours(model, ids, pixels, grid, group, new, repeats)
            stats = device.memory_stats() or {}
            line = {"prompts": prompts, "rows": rows, "hf_tokens_s": rows * new / hf_new,
                    "hf_peak_gib": hf_peak / 2 ** 30, "jax_peak_gib": stats.get("peak_bytes_in_use", 0) / 2 ** 30}
            for path, (t_new, t_one) in ours.items():
                step = (t_new - t_one) / max(new - 1, 1)
                floor = floor_step_bytes(cfg, weights, prompts, group, length, new, itemsize,
                                         shared_prefix=path == "cascade") / bandwidth
                line[f"{path}_tokens_s"] = rows * new / t_new
                line[f"{path}_step_ms"] = step * 1e3
                line[f"{path}_floor_ms"] = floor * 1e3
                line[f"{path}_of_floor"] = floor / step if step > 0 else float("nan")
            line["hf_step_ms"] = (hf_new - hf_one) / max(new - 1, 1) * 1e3
            line["vs_hf"] = line["cascade_tokens_s"] / line["hf_tokens_s"]
            results[prompts] = line
            print(" ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in line.items()),
                  flush=True)
    big = results[cases[-1]]
    emit("gpu_sampling", big["cascade_tokens_s"], big["hf_tokens_s"], "new tokens/s", GOAL,
         of_floor=round(big["cascade_of_floor"], 3), copy_tokens_s=round(big["copy_tokens_s"], 1),
         one_prompt_vs_hf=round(results[cases[0]]["vs_hf"], 3), device=device.device_kind)


if __name__ == "__main__":
    main()
