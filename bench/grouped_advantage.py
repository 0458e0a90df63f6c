"""Grouped advantages + Salvage-DS gates: our one-pass path vs a textbook jnp version, on CPU.

Side by side in one run, both jitted XLA on [num_groups, G] float32 rewards with a ragged
mask (full: 65,536 groups x 8; --quick: 16,384 x 8):
  ours    kernels.grouped_advantage.grouped_advantages (the CPU default: the reference path)
  anchor  the obvious formulation: masked mean, masked std, advantages, then the flags from
          separate count / positive-count reductions
The Pallas kernel is also run in interpret mode on a slice and checked against ours (CPU
interpret mode measures nothing about speed). Ends with one JSON line (goal: ratio <= 1.2).

    .venv/bin/python bench/grouped_advantage.py [--quick]
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
from kernels.grouped_advantage import grouped_advantages  # noqa: E402

GATES = dict(eps=1e-6, contrast_std_min=0.0, competence_min=0.125, competence_max=0.875)


def textbook(rewards, mask):
    """Returns (mean, std, advantages, contrast, competence) the obvious way."""
    m = mask.astype(jnp.float32)
    n = m.sum(-1)
    mean = (rewards * m).sum(-1) / jnp.maximum(n, 1)
    std = jnp.sqrt((((rewards - mean[:, None]) * m) ** 2).sum(-1) / jnp.maximum(n, 1))
    adv = (rewards - mean[:, None]) / (std[:, None] + GATES["eps"]) * m
    n_pos = ((rewards > 0) & mask).sum(-1)
    frac = n_pos / jnp.maximum(n, 1)
    contrast = (n_pos > 0) & (n_pos < n) & (std > GATES["contrast_std_min"])
    competence = (n > 0) & (frac >= GATES["competence_min"]) & (frac <= GATES["competence_max"])
    return mean, std, adv, contrast, competence


def ours(rewards, mask):
    s = grouped_advantages(rewards, mask, **GATES)
    return s.mean, s.std, s.advantages, s.contrast, s.competence


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    n, g = (16_384, 8) if args.quick else (65_536, 8)
    rng = np.random.default_rng(0)
    rewards = jnp.asarray(rng.choice([-1.0, 1.0], size=(n, g)), jnp.float32)
    mask = jnp.asarray(rng.random((n, g)) > 0.1)
    fns = {"ours": jax.jit(ours), "anchor": jax.jit(textbook)}
    outs = {k: jax.block_until_ready(f(rewards, mask)) for k, f in fns.items()}
    for a, b in zip(outs["ours"], outs["anchor"]):
        np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32),
                                   atol=1e-5)
    times = {k: [] for k in fns}
    for _ in range(20 if args.quick else 50):
        for k, f in fns.items():
            start = time.perf_counter()
            jax.block_until_ready(f(rewards, mask))
            times[k].append(time.perf_counter() - start)
    med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    small = slice(0, 1000)
    interp = grouped_advantages(rewards[small], mask[small], impl="pallas_interpret", **GATES)
    np.testing.assert_allclose(np.asarray(interp.advantages),
                               np.asarray(outs["ours"][2][small]), atol=1e-5)
    print(f"{n} groups x {g}: ours {med['ours']:.3f} ms, textbook {med['anchor']:.3f} ms; "
          "Pallas interpret (1000 groups) matches")
    # goal: ours / textbook time, at most 1.2
    emit("grouped_advantage", med["ours"], med["anchor"], f"ms per call, CPU, {n} groups x {g}", 1.2, digits=4)


if __name__ == "__main__":
    main()
