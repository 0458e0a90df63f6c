"""Fused (chunked) token log-probs vs the naive log-softmax on CPU: time and temporary memory.

Side by side in one run:
  time    jit(value_and_grad(sum of log-probs)) w.r.t. hidden and lm_head, float32, on a
          smaller shape (full: T=1024, D=1024, V=32768; --quick: T=512, D=512, V=16384);
          runs alternate between the two programs, the median is reported.
  memory  XLA's temporary bytes for the same program at T=4096, D=4096, V=151,936 (compile
          only, nothing allocated), float32 (and bf16 in the full run).
Ends with one JSON line: ours / anchor = chunked / naive seconds (goal: ratio <= 1.2), plus
the memory ratios naive / fused (goal: >= 4) and the [naive, fused] MiB as extra keys.

    .venv/bin/python bench/token_logprobs.py [--quick]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from bench.report import emit  # noqa: E402
from kernels.token_logprobs import token_logprobs  # noqa: E402

BIG = (4096, 4096, 151_936)


def value_and_grad_fn(impl: str):
    def loss(h, w, y):
        return token_logprobs(h, w, y, impl=impl).sum()
    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))


def time_side_by_side(shape, repeats: int) -> dict:
    """Returns median seconds per call for each impl, runs interleaved."""
    t, d, v = shape
    rng = np.random.default_rng(0)
    h = jnp.asarray(rng.normal(size=(t, d)), jnp.float32)
    w = jnp.asarray(rng.normal(size=(d, v)) / np.sqrt(d), jnp.float32)
    y = jnp.asarray(rng.integers(0, v, size=t), jnp.int32)
    fns = {impl: value_and_grad_fn(impl) for impl in ("chunked", "reference")}
    outs = {impl: jax.block_until_ready(fn(h, w, y)) for impl, fn in fns.items()}  # compile
    (val_a, (dh_a, dw_a)), (val_b, (dh_b, dw_b)) = outs["chunked"], outs["reference"]
    err = max(float(jnp.abs(val_a - val_b) / jnp.abs(val_b)),
              float(jnp.abs(dh_a - dh_b).max() / jnp.abs(dh_b).max()),
              float(jnp.abs(dw_a - dw_b).max() / jnp.abs(dw_b).max()))
    times = {impl: [] for impl in fns}
    for _ in range(repeats):
        for impl, fn in fns.items():
            start = time.perf_counter()
            jax.block_until_ready(fn(h, w, y))
            times[impl].append(time.perf_counter() - start)
    return {"chunked": statistics.median(times["chunked"]),
            "reference": statistics.median(times["reference"]), "max_rel_err": err}


def temp_bytes(impl: str, dtype) -> int:
    """Returns XLA's temporary bytes for value_and_grad at the big shape (compile only)."""
    t, d, v = BIG
    args = (jax.ShapeDtypeStruct((t, d), dtype), jax.ShapeDtypeStruct((d, v), dtype),
            jax.ShapeDtypeStruct((t,), jnp.int32))
    compiled = value_and_grad_fn(impl).lower(*args).compile()
    return compiled.memory_analysis().temp_size_in_bytes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller shape, fewer repeats")
    args = parser.parse_args()
    jax.config.update("jax_default_matmul_precision", "highest")
    shape = (512, 512, 16_384) if args.quick else (1024, 1024, 32_768)
    timing = time_side_by_side(shape, repeats=3 if args.quick else 5)
    mem = {}
    for name, dtype in [("f32", jnp.float32)] + ([] if args.quick else [("bf16", jnp.bfloat16)]):
        naive, fused = temp_bytes("reference", dtype), temp_bytes("chunked", dtype)
        mem[name] = (naive / 2**20, fused / 2**20, naive / fused)
    t, d, v = shape
    print(f"time T={t} D={d} V={v} f32 value+grad: chunked {timing['chunked']:.3f} s, "
          f"naive {timing['reference']:.3f} s (max rel. diff {timing['max_rel_err']:.1e})")
    print("memory T=4096 D=4096 V=151936 temp: " + "; ".join(
        f"{k}: naive {a:.0f} MiB, fused {b:.0f} MiB, ratio {r:.1f}x (goal >= 4)"
        for k, (a, b, r) in mem.items()))
    # goal: ours / naive time, at most 1.2; extras: temporary memory at T=4096 D=4096 V=151936,
    # naive / ours (goal: at least 4).
    emit("token_logprobs", timing["chunked"], timing["reference"],
         f"s per value_and_grad, CPU f32, T={t} D={d} V={v}", 1.2, digits=4,
         **{f"temp_memory_ratio_{k}": round(r, 1) for k, (_, _, r) in mem.items()},
         **{f"temp_mib_{k}": [round(a), round(b)] for k, (a, b, _) in mem.items()})


if __name__ == "__main__":
    main()
