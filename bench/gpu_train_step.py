"""Training step on one GPU, bf16 compute: ours (jax) vs transformers torch (autocast bf16), side by side.

For when a GPU is at hand (jax with CUDA, torch with CUDA, transformers). Model: the published
Qwen3-VL-2B-Instruct shape (text 28 x 2048, 16 q / 8 kv heads, MLP 6144, vocab 151,936, tied head;
vision 24 x 1024, DeepStack on 3 layers) with random weights; batch 8 x 2048 tokens, one 448x448
image per row (196 image tokens). Both sides keep float32 master weights and run bf16 matmuls
(ours: compute_dtype=bfloat16; torch: autocast), AdamW with the same hyper-parameters.

Ours runs in variants: attention through cuDNN (jax.nn.dot_product_attention) or XLA; the loss
through kernels/token_logprobs as the Pallas (Triton) kernel, the chunked lax loop, or the naive
log-softmax ("reference"); torch's is transformers' own cross-entropy over materialised logits.
Torch runs first (its allocator gives memory back; JAX's preallocation would not). JAX takes 95% of the GPU's
memory (XLA_PYTHON_CLIENT_MEM_FRACTION, unless given; JAX's own 75% ran out of memory here). MFU is against the
bf16 matmul peak measured in the same run (8192^3 jax matmul).
--quick: 12 text layers, batch 4; --cpu-dry-run: the tiny test config on CPU (checks the script only).
Ends with one JSON line: ours = best jax tokens/s, anchor = torch tokens/s.

    python bench/gpu_train_step.py [--quick] [--cpu-dry-run]
"""
from __future__ import annotations

import argparse
import functools
import dataclasses
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402

from bench.report import emit  # noqa: E402

GOAL = 1.0  # ours / torch tokens/s, at least
# JAX's share of GPU memory unless XLA_PYTHON_CLIENT_MEM_FRACTION is given: at JAX's default 0.75 every variant of
# ours ran out of memory at this shape on an H200 (2026-12-04); at 0.95 all ran, torch's side too.
GPU_MEMORY_FRACTION = 0.95


def qwen3_vl_2b(layers: int = 28):
    """Returns our config of the published Qwen3-VL-2B-Instruct shape (random weights)."""
    from rmsweb_jax.models.qwen3_vl import Qwen3VLConfig, TextConfig, VisionConfig
    text = TextConfig(vocab_size=151_936, hidden_size=2048, intermediate_size=6144, num_hidden_layers=layers,
                      num_attention_heads=16, num_key_value_heads=8, head_dim=128, mrope_section=(24, 20, 20))
    vision = VisionConfig(depth=24, hidden_size=1024, intermediate_size=4096, num_heads=16, out_hidden_size=2048,
                          num_position_embeddings=2304, deepstack_visual_indexes=(5, 11, 17))
    return Qwen3VLConfig(text=text, vision=vision, tie_word_embeddings=True)


def batch_inputs(cfg, batch: int, length: int, side: int, seed: int = 0):
    """Returns (ids [B, L], pixel_values, grid): one side x side image per row after 4 text tokens."""
    rng = np.random.default_rng(seed)
    p, m = cfg.vision.patch_size, cfg.vision.spatial_merge_size
    g = side // p
    n_img = g * g // (m * m)
    ids = rng.integers(10, min(cfg.text.vocab_size, 150_000) - 10, (batch, length)).astype(np.int64)
    ids[ids == cfg.image_token_id] = 11
    ids[:, 4] = cfg.vision_start_token_id
    ids[:, 5:5 + n_img] = cfg.image_token_id
    ids[:, 5 + n_img] = cfg.vision_end_token_id
    pixels = rng.standard_normal((batch * g * g, cfg.vision.patch_dim)).astype(np.float32)
    return ids, pixels, np.array([(1, g, g)] * batch, np.int64)


def bench_ours(cfg, ids, pixels, grid, steps: int, attention: str, loss_impl: str):
    import jax
    import jax.numpy as jnp
    import optax
    from flax import nnx
    from kernels.token_logprobs import token_logprobs
    from rmsweb_jax.models.qwen3_vl import RuntimeOptions, create, prepare_inputs

    runtime = RuntimeOptions(param_dtype="float32", compute_dtype="bfloat16", attention_impl=attention)
    model = create(cfg, runtime, seed=0)
    inputs = jax.tree.map(jnp.asarray, prepare_inputs(cfg, ids, pixel_values=pixels, image_grid_thw=grid))
    targets = jnp.asarray(ids[:, 1:], jnp.int32)
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    tx = optax.adamw(1e-5, weight_decay=0.0)
    # Committed, so the second call does not compile again (an uncommitted optax count would).
    params, opt_state = jax.device_put((params, tx.init(params)), jax.devices()[0])

    def loss_fn(params):
        m = nnx.merge(graphdef, params, rest)
        hidden, _ = m.hidden_states(inputs)
        head = m.text.lm_head_matrix().astype(hidden.dtype)
        return -jnp.mean(token_logprobs(hidden[:, :-1], head, targets, impl=loss_impl))

    @functools.partial(jax.jit, donate_argnums=(0, 1))  # in place, as the trainer's step
    def step(params, opt_state):
        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    t0 = time.perf_counter()
    params, opt_state, loss = step(params, opt_state)
    first = float(loss)
    compile_s = time.perf_counter() - t0
    start = time.perf_counter()
    for _ in range(steps):
        params, opt_state, loss = step(params, opt_state)
    jax.block_until_ready(loss)
    per_step = (time.perf_counter() - start) / steps
    del params, opt_state, model
    return per_step, first, compile_s


def bench_torch(cfg, ids, pixels, grid, steps: int, device: str):
    import torch
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration
    hf = Qwen3VLConfig(**cfg.to_hf_dict())
    with torch.device(device):
        model = Qwen3VLForConditionalGeneration._from_config(hf, attn_implementation="sdpa", dtype=torch.float32)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, weight_decay=0.0, fused=device == "cuda")
    kw = dict(input_ids=torch.from_numpy(ids).to(device), pixel_values=torch.from_numpy(pixels).to(device),
              image_grid_thw=torch.from_numpy(grid).to(device),
              mm_token_type_ids=torch.from_numpy((ids == cfg.image_token_id).astype(np.int64)).to(device))
    labels = kw["input_ids"]

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=device == "cuda"):
            out = model(**kw, labels=labels)
        out.loss.backward()
        opt.step()
        return out.loss

    first = float(step().detach())
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    sync()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    sync()
    per_step = (time.perf_counter() - start) / steps
    del model, opt
    if device == "cuda":
        torch.cuda.empty_cache()
    return per_step, first


def peak_bf16_tflops(n: int = 8192, repeats: int = 10) -> float:
    """Returns the mean bf16 matmul TFLOP/s of jax on this device (the MFU denominator)."""
    import jax
    import jax.numpy as jnp
    a = jax.random.normal(jax.random.key(0), (n, n), jnp.bfloat16)
    f = jax.jit(lambda x: x @ x)
    for _ in range(3):
        f(a).block_until_ready()
    t0 = time.perf_counter()
    for _ in range(repeats):
        out = f(a)
    out.block_until_ready()
    return 2 * n ** 3 * repeats / (time.perf_counter() - t0) / 1e12


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--cpu-dry-run", action="store_true")
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()
    if args.cpu_dry_run:
        os.environ["JAX_PLATFORMS"] = "cpu"
    from rmsweb_jax.distributed import GPU_MEMORY_VAR, gpu_memory_fraction
    memory_line = gpu_memory_fraction(fraction=GPU_MEMORY_FRACTION)  # before JAX's client starts, below
    import jax
    from train_step import model_flops_per_step
    from rmsweb_jax.models.qwen3_vl import tiny

    on_gpu = jax.default_backend() == "gpu"
    if not on_gpu and not args.cpu_dry_run:
        print("no GPU: nothing to measure (use --cpu-dry-run to check the script on CPU)")
        emit("gpu_train_step", None, None, "tokens/s", GOAL)
        return
    if args.cpu_dry_run:
        cfg, batch, length, side, steps = tiny(vocab_size=512), 2, 128, 64, 1
        cfg = dataclasses.replace(cfg, vision=dataclasses.replace(cfg.vision, num_position_embeddings=64))
    else:
        cfg = qwen3_vl_2b(12 if args.quick else 28)
        batch, length, side, steps = (4 if args.quick else 8), 2048, 448, args.steps
    ids, pixels, grid = batch_inputs(cfg, batch, length, side)
    tokens = batch * length
    flops = model_flops_per_step(cfg, batch, length, pixels.shape[0])
    # torch first: its caching allocator hands memory back (empty_cache), JAX's preallocation would not
    try:
        torch_s, torch_first = bench_torch(cfg, ids, pixels, grid, steps, "cuda" if on_gpu else "cpu")
    except Exception as e:
        print(f"torch failed: {type(e).__name__}: {str(e)[:400]}", flush=True)
        torch_s = torch_first = None
    peak = None if args.cpu_dry_run else peak_bf16_tflops()
    print(f"device {jax.devices()[0].device_kind}; {memory_line}", flush=True)
    print(f"model {cfg.text.num_hidden_layers} text layers, "
          f"batch {batch} x {length}; {flops / 1e12:.1f} TFLOP/step; bf16 matmul peak "
          f"{peak if peak is None else round(peak, 1)} TFLOP/s", flush=True)
    if torch_s is not None:
        mfu = "" if peak is None else f", MFU {flops / torch_s / 1e12 / peak:.1%}"
        print(f"torch: {torch_s * 1e3:.1f} ms/step, {tokens / torch_s:.0f} tok/s{mfu}; first loss {torch_first:.4f}",
              flush=True)
    results = {}
    loss_variants = ("chunked", "reference") if args.cpu_dry_run else ("pallas", "chunked", "reference")
    for attention, loss_impl in [("cudnn", impl) for impl in loss_variants] + [("xla", "chunked")]:
        name = f"{attention}/{loss_impl}"
        try:
            s, first, compile_s = bench_ours(cfg, ids, pixels, grid, steps, attention, loss_impl)
        except Exception as e:  # report and go on: one failing variant must not hide the others
            print(f"ours[{name}] failed: {type(e).__name__}: {str(e)[:400]}", flush=True)
            continue
        results[name] = s
        mfu = "" if peak is None else f", MFU {flops / s / 1e12 / peak:.1%}"
        print(f"ours[{name}]: {s * 1e3:.1f} ms/step, {tokens / s:.0f} tok/s{mfu}; first loss {first:.4f}; "
              f"compile+first step {compile_s:.1f} s", flush=True)
    best = min(results.values()) if results else None
    ours = None if best is None else tokens / best
    anchor = None if torch_s is None else tokens / torch_s
    extra = {} if peak is None or best is None else dict(mfu=round(flops / best / 1e12 / peak, 3),
                                                        peak_tflops=round(peak, 1))
    extra["jax_memory_fraction"] = os.environ[GPU_MEMORY_VAR]
    emit("gpu_train_step", ours, anchor, "tokens/s", GOAL, **extra)


if __name__ == "__main__":
    main()
