"""Interval estimates and tests for success rates: Wilson, cluster and paired bootstrap, exact McNemar.

Why these four:
- Wilson for a per-task success rate: unlike the normal (Wald) interval it stays inside [0, 1] and
  keeps its coverage at 0/n and n/n, which a well-trained policy hits on easy tasks.
- The overall success pools episodes of many tasks, and episodes of one task are not independent
  draws (they share its difficulty), so its bootstrap resamples whole tasks (clusters), not episodes.
- Two policies played on the same (task, seed) pairs are compared pair by pair: resampling pairs keeps
  the correlation that makes the comparison sharper than two separate intervals; resampling within
  each task keeps the task mix fixed, as it is in the evaluation itself.
- McNemar's exact test uses only the discordant pairs (one policy solved, the other not), with the
  binomial rather than the chi-square approximation, since evaluations have few discordant pairs.
Bootstrap intervals use the percentile method; every draw is vectorised with numpy (10,000 samples of
2,000 pairs take a fraction of a second).
"""
from __future__ import annotations

import math
from typing import Mapping, Sequence

import numpy as np

Z95 = 1.959963984540054  # the standard normal's 97.5% quantile
_CHUNK = 1_000_000  # resampled values held at once: bounds memory at ~12 MB whatever samples x pairs


def wilson_interval(successes: int, n: int, z: float = Z95) -> tuple[float, float]:
    """Returns the Wilson score interval (low, high) of a binomial proportion; (0, 1) for n = 0."""
    if n == 0:
        return 0.0, 1.0
    if not 0 <= successes <= n:
        raise ValueError(f"wilson_interval: successes={successes} must lie in 0..n={n}")
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def _check_bootstrap(samples: int, level: float) -> None:
    if samples < 1:
        raise ValueError(f"bootstrap samples={samples}: needs at least 1 (10_000 is usual)")
    if not 0 < level < 1:
        raise ValueError(f"bootstrap level={level}: needs 0 < level < 1 (e.g. 0.95)")


def _percentiles(statistics: np.ndarray, level: float) -> tuple[float, float]:
    tail = (1 - level) / 2
    low, high = np.quantile(statistics, [tail, 1 - tail])
    return float(low), float(high)


def _resampled_sums(values: np.ndarray, samples: int, rng: np.random.Generator) -> np.ndarray:
    """Returns [samples] sums of len(values) draws with replacement from `values`."""
    n = len(values)
    distinct, counts = np.unique(values, return_counts=True)
    if len(distinct) <= 16:
        # Few distinct values (0/1 outcomes, -1/0/1 differences): a draw of n items is a multinomial
        # over the distinct values, the same distribution as drawing indices at a tiny fraction of the cost.
        return rng.multinomial(n, counts / n, size=samples) @ distinct
    out = np.empty(samples)
    rows = max(1, _CHUNK // n)
    for start in range(0, samples, rows):
        stop = min(samples, start + rows)
        out[start:stop] = values[rng.integers(0, n, size=(stop - start, n), dtype=np.int32)].sum(axis=1)
    return out


def cluster_bootstrap_interval(outcomes: Mapping[str, Sequence[float]], *, samples: int, seed: int,
                               level: float = 0.95) -> tuple[float, float]:
    """Returns the percentile bootstrap interval of the pooled mean of `outcomes` (cluster -> values,
    e.g. task -> 0/1 successes) when whole clusters are resampled with replacement."""
    _check_bootstrap(samples, level)
    sizes = np.array([len(v) for v in outcomes.values()], dtype=np.int64)
    if not len(sizes) or sizes.min() == 0:
        empty = [k for k, v in outcomes.items() if not len(v)]
        raise ValueError(f"cluster_bootstrap_interval: every cluster needs an outcome; got "
                         f"{'no clusters' if not len(sizes) else f'empty clusters {empty[:3]}'}")
    sums = np.array([float(np.sum(v)) for v in outcomes.values()])
    rng = np.random.default_rng(seed)
    pooled = np.empty(samples)
    rows = max(1, _CHUNK // len(sizes))
    for start in range(0, samples, rows):
        stop = min(samples, start + rows)
        picks = rng.integers(0, len(sizes), size=(stop - start, len(sizes)), dtype=np.int32)
        pooled[start:stop] = sums[picks].sum(axis=1) / sizes[picks].sum(axis=1)
    return _percentiles(pooled, level)


def paired_bootstrap_interval(a: Sequence[float], b: Sequence[float], strata: Sequence[str] | None = None, *,
                              samples: int, seed: int, level: float = 0.95) -> tuple[float, float]:
    """Returns the percentile bootstrap interval of mean(a) - mean(b) over pairs (a[i], b[i]) resampled
    with replacement, within each stratum (e.g. task) when `strata` is given, so the strata keep their sizes."""
    _check_bootstrap(samples, level)
    diff = np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64) if len(a) == len(b) else None
    if diff is None or not len(diff):
        raise ValueError(f"paired_bootstrap_interval: a and b must be paired and non-empty; got "
                         f"{len(a)} and {len(b)} values")
    if strata is None:
        strata = [""] * len(diff)
    elif len(strata) != len(diff):
        raise ValueError(f"paired_bootstrap_interval: strata has {len(strata)} labels for {len(diff)} pairs")
    labels = np.asarray(list(strata), dtype=object)
    rng = np.random.default_rng(seed)
    total = np.zeros(samples)
    for label in sorted(set(strata)):
        total += _resampled_sums(diff[labels == label], samples, rng)
    return _percentiles(total / len(diff), level)


def mcnemar_exact(b: int, c: int) -> float:
    """Returns the two-sided exact McNemar p-value for discordant pair counts b and c:
    min(1, 2 P[X <= min(b, c)]) with X ~ Binomial(b + c, 1/2); 1.0 when b + c == 0."""
    if b < 0 or c < 0:
        raise ValueError(f"mcnemar_exact: discordant counts must be >= 0, got b={b}, c={c}")
    n = b + c
    if n == 0:
        return 1.0
    # Exact integers, one division: no underflow of 0.5 ** n for large n.
    tail = sum(math.comb(n, i) for i in range(min(b, c) + 1))
    return min(1.0, 2 * tail / 2 ** n)
