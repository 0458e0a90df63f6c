"""Both Pallas kernels on a GPU (Triton layout): checked against the references, timed against XLA.

For when a GPU is at hand (needs jax with CUDA). Side by side in one run:
  grouped advantages  Pallas kernel vs the jnp reference (XLA), 65,536 groups x 8
  token log-probs     correctness in float32 (ragged T, V, D; entropy; gradients w.r.t. h
                      and W), then jit(value_and_grad) in bf16: Pallas vs the naive
                      log-softmax (XLA) vs the chunked lax loop, with XLA's temp memory
                      full: T=4096, D=4096, V=151,936; --quick: T=1024, D=2048, V=32,000
Exits cleanly with a message (and a JSON line of nulls) when no GPU is present.
--cpu-dry-run runs the same script path on CPU with the kernels in interpret mode at toy
shapes (to check the script itself; its timings mean nothing).
Ends with one JSON line: ours = Pallas value_and_grad ms, anchor = naive XLA ms.

    python bench/gpu_kernels.py [--quick] [--cpu-dry-run]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from bench.report import emit  # noqa: E402
from kernels import grouped_advantage as ga  # noqa: E402
from kernels.token_logprobs import token_logprobs_reference  # noqa: E402
from kernels.token_logprobs_chunked import token_logprobs_chunked  # noqa: E402
from kernels.token_logprobs_gpu import token_logprobs_gpu  # noqa: E402

GOAL = 1.0  # Pallas / XLA naive time (bf16 value_and_grad), at most


def gpu_present() -> bool:
    try:
        return len(jax.devices("gpu")) > 0
    except RuntimeError:
        return False


def median_ms(fn, *args, repeats: int) -> float:
    jax.block_until_ready(fn(*args))  # compile + warm up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def max_rel(a, b) -> float:
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))


def bench_grouped(n: int, g: int, interpret: bool, repeats: int) -> str:
    rng = np.random.default_rng(0)
    rewards = jnp.asarray(rng.choice([-1.0, 1.0], size=(n, g)), jnp.float32)
    valid = jnp.asarray(rng.random((n, g)) > 0.1, jnp.float32)
    gates = ga.Gates(competence_min=0.125, competence_max=0.875)
    pallas = jax.jit(lambda r, m: ga.grouped_arrays_pallas(r, m, gates, "gpu", interpret, None))
    xla = jax.jit(lambda r, m: ga._reference_arrays(r, m, gates))
    for name, a, b in zip(("mean", "std", "count", "frac", "contrast", "competence", "adv"),
                          pallas(rewards, valid), xla(rewards, valid)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5, err_msg=name)
    t_p = median_ms(pallas, rewards, valid, repeats=repeats)
    t_x = median_ms(xla, rewards, valid, repeats=repeats)
    return f"grouped advantages {n}x{g}: Pallas {t_p:.3f} ms, XLA {t_x:.3f} ms (match)"


def inputs(t, d, v, dtype, seed=0):
    rng = np.random.default_rng(seed)
    h = jnp.asarray(rng.normal(size=(t, d)), dtype)
    w = jnp.asarray(rng.normal(size=(d, v)) * 2 / np.sqrt(d), dtype)
    return h, w, jnp.asarray(rng.integers(0, v, size=t), jnp.int32)


def loss_fn(kind: str, interpret: bool):
    """Returns jit(value_and_grad) of sum(logp) + 0.1 * sum(entropy) for one implementation."""
    def loss(h, w, y):
        if kind == "pallas":
            logp, ent = token_logprobs_gpu(h, w, y, temperature=0.9, return_entropy=True,
                                           interpret=interpret)
        elif kind == "chunked":
            logp, ent = token_logprobs_chunked(h, w, y, temperature=0.9, return_entropy=True)
        else:
            logp, ent = token_logprobs_reference(h, w, y, temperature=0.9)
        return jnp.sum(logp) + 0.1 * jnp.sum(ent)
    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))


def check_token_logprobs(interpret: bool) -> str:
    """Float32 check with ragged T, V and D; returns a summary line (raises on mismatch)."""
    h, w, y = inputs(*((40, 40, 300) if interpret else (300, 520, 5003)), jnp.float32, seed=1)
    with jax.default_matmul_precision("highest"):
        (val_p, grads_p), (val_x, grads_x) = (loss_fn(k, interpret)(h, w, y)
                                              for k in ("pallas", "reference"))
    errs = [max_rel(val_p, val_x)] + [max_rel(a, b) for a, b in zip(grads_p, grads_x)]
    # Atomic float adds reorder the gradient sums: allow a little more than 1e-5.
    if max(errs) > 1e-4:
        raise AssertionError(f"token log-probs mismatch (value, dh, dW rel. err): {errs}")
    return f"token log-probs f32 check: value/dh/dW max rel. err {max(errs):.1e}"


def bench_token_logprobs(shape, interpret: bool, repeats: int):
    h, w, y = inputs(*shape, jnp.bfloat16)
    results, temp_mib = {}, {}
    for kind in ("pallas", "reference", "chunked"):
        fn = loss_fn(kind, interpret)
        results[kind] = fn(h, w, y)
        temp_mib[kind] = fn.lower(h, w, y).compile().memory_analysis().temp_size_in_bytes / 2**20
    val_p, (dh_p, dw_p) = results["pallas"]
    val_x, (dh_x, dw_x) = results["reference"]
    errs = (max_rel(val_p, val_x), max_rel(dh_p, dh_x), max_rel(dw_p, dw_x))
    if max(errs) > 2e-2:  # bf16 gradients: 8 mantissa bits
        raise AssertionError(f"bf16 token log-probs mismatch (value, dh, dW): {errs}")
    ms = {k: median_ms(loss_fn(k, interpret), h, w, y, repeats=repeats) for k in results}
    return ms, temp_mib, errs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--cpu-dry-run", action="store_true",
                        help="interpret mode on CPU at toy shapes (checks the script only)")
    args = parser.parse_args()
    if not args.cpu_dry_run and not gpu_present():
        print(f"No GPU found (backend: {jax.default_backend()}); nothing to run. "
              "Install jax with CUDA on a GPU machine, or pass --cpu-dry-run.")
        emit("gpu_kernels", None, None, "ms", GOAL)
        return 0
    interpret = args.cpu_dry_run
    repeats = 2 if interpret else (5 if args.quick else 20)
    if interpret:
        shape, groups = (48, 64, 500), (300, 8)
    else:
        shape = (1024, 2048, 32_000) if args.quick else (4096, 4096, 151_936)
        groups = (65_536, 8)
    print(f"device: {jax.devices()[0].device_kind}")
    print(bench_grouped(*groups, interpret=interpret, repeats=repeats))
    print(check_token_logprobs(interpret))
    ms, temp, errs = bench_token_logprobs(shape, interpret, repeats)
    t, d, v = shape
    print(f"token log-probs bf16 T={t} D={d} V={v} value_and_grad: " + ", ".join(
        f"{k} {ms[k]:.2f} ms / temp {temp[k]:.0f} MiB" for k in ms)
        + f"; rel. err vs naive (value, dh, dW) {', '.join(f'{e:.1e}' for e in errs)}")
    emit("gpu_kernels", ms["pallas"], ms["reference"],
         f"ms per value_and_grad, bf16, T={t} D={d} V={v}" + (" (CPU interpret dry run)" if interpret else ""),
         GOAL, digits=3, chunked_ms=round(ms["chunked"], 3), temp_mib={k: round(v) for k, v in temp.items()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
