"""The evaluation statistics against hand-computed and published values, simulation and an independent loop."""
import math
import random

import numpy as np
import pytest

from rmsweb_jax.evaluate.stats import (Z95, cluster_bootstrap_interval, mcnemar_exact, paired_bootstrap_interval,
                                       wilson_interval)


def test_z95_is_the_normal_quantile():
    # Phi(z) = (1 + erf(z / sqrt 2)) / 2 = 0.975
    assert (1 + math.erf(Z95 / math.sqrt(2))) / 2 == pytest.approx(0.975, abs=1e-12)


def test_wilson_bounds_by_hand():
    # 0/10: the low bound is 0 and the high one z^2/n / (1 + z^2/n) = 0.384146 / 1.384146.
    assert wilson_interval(0, 10) == pytest.approx((0.0, 0.2775), abs=1e-4)
    assert wilson_interval(0, 10)[1] == pytest.approx(0.384146 / 1.384146, abs=1e-6)
    # 5/10: symmetric about 1/2, half-width z sqrt(0.025 + 0.0096037) / 1.384146 = 0.263396.
    assert wilson_interval(5, 10) == pytest.approx((0.2366, 0.7634), abs=1e-4)
    assert wilson_interval(10, 10) == pytest.approx((0.7225, 1.0), abs=1e-4)
    assert wilson_interval(0, 0) == (0.0, 1.0)


def test_wilson_bounds_match_newcombes_published_table():
    # Newcombe (1998), Statistics in Medicine 17:857, Table I, method 3 (score interval, no continuity correction).
    assert wilson_interval(81, 263) == pytest.approx((0.2553, 0.3662), abs=1e-4)
    assert wilson_interval(15, 148) == pytest.approx((0.0624, 0.1605), abs=1e-4)
    assert wilson_interval(0, 20) == pytest.approx((0.0, 0.1611), abs=1e-4)
    assert wilson_interval(1, 29) == pytest.approx((0.0061, 0.1718), abs=1e-4)


def test_wilson_rejects_more_successes_than_trials():
    with pytest.raises(ValueError, match="successes=11"):
        wilson_interval(11, 10)


def test_mcnemar_exact_on_a_known_table():
    # b = 3, c = 10: P[X <= 3], X ~ Bin(13, 1/2) = (1 + 13 + 78 + 286) / 2^13 = 378 / 8192.
    assert mcnemar_exact(3, 10) == pytest.approx(2 * 378 / 8192, rel=1e-12)
    assert mcnemar_exact(10, 3) == mcnemar_exact(3, 10)
    # b = 0, c = 6: 2 / 64.
    assert mcnemar_exact(0, 6) == pytest.approx(2 / 64, rel=1e-12)
    assert mcnemar_exact(5, 5) == 1.0  # 2 P[X <= 5] > 1 for X ~ Bin(10, 1/2)
    assert mcnemar_exact(0, 0) == 1.0
    with pytest.raises(ValueError, match="b=-1"):
        mcnemar_exact(-1, 3)


def test_mcnemar_exact_matches_scipys_binomial_test():
    binomtest = pytest.importorskip("scipy.stats").binomtest
    for b, c in ((3, 10), (1, 1), (7, 20), (40, 61), (500, 600)):
        assert mcnemar_exact(b, c) == pytest.approx(binomtest(b, b + c, 0.5).pvalue, rel=1e-9), (b, c)


def _paired_sample(rng, n, tasks):
    """Returns (a, b, strata, true difference): a per-task success rate shared by both policies,
    policy a better by a known margin, the two outcomes of a pair correlated through a shared draw."""
    rates = np.linspace(0.2, 0.8, tasks)
    strata = [f"task{i % tasks}" for i in range(n)]
    base = rates[np.arange(n) % tasks]
    u = rng.random(n)  # shared: the two policies tend to solve the same seeds
    a = (u < base + 0.1).astype(float)
    b = (u < base).astype(float)
    noise = rng.random(n) < 0.2  # some pairs drawn independently for b
    b[noise] = (rng.random(noise.sum()) < base[noise]).astype(float)
    true = float(np.mean(np.minimum(base + 0.1, 1.0)) - np.mean(base))
    return a, b, strata, true


def test_paired_bootstrap_covers_the_true_difference_of_simulated_samples():
    rng = np.random.default_rng(2024)
    repeats, hits, hits_stratified = 200, 0, 0
    for r in range(repeats):
        a, b, strata, true = _paired_sample(rng, 300, 6)
        low, high = paired_bootstrap_interval(a, b, samples=1000, seed=r)
        hits += low <= true <= high
        low, high = paired_bootstrap_interval(a, b, strata, samples=1000, seed=r)
        hits_stratified += low <= true <= high
    assert hits >= 0.9 * repeats, hits  # 189 of 200 with this seed (nominal 95%)
    assert hits_stratified >= 0.9 * repeats, hits_stratified


def test_paired_bootstrap_resamples_within_strata():
    # Within each task the difference is constant, so a stratified resample always gives 0.5, while
    # resampling across tasks moves the mix of the two tasks.
    a = [1.0] * 10 + [1.0] * 10
    b = [0.0] * 10 + [1.0] * 10
    strata = ["t1"] * 10 + ["t2"] * 10
    assert paired_bootstrap_interval(a, b, strata, samples=2000, seed=0) == (0.5, 0.5)
    low, high = paired_bootstrap_interval(a, b, samples=2000, seed=0)
    assert low < 0.35 and high > 0.65
    assert low == pytest.approx(0.5 - 1.96 * 0.5 / math.sqrt(20), abs=0.06)  # binomial sd of the mix


def test_paired_bootstrap_matches_a_plain_loop_on_continuous_values():
    rng = np.random.default_rng(1)
    a, b = rng.normal(1.0, 1.0, 300), rng.normal(0.8, 1.0, 300)
    low, high = paired_bootstrap_interval(a, b, samples=4000, seed=3)
    loop = random.Random(3)
    d = list(a - b)
    means = sorted(sum(loop.choices(d, k=len(d))) / len(d) for _ in range(4000))
    assert low == pytest.approx(means[100], abs=0.02) and high == pytest.approx(means[3899], abs=0.02)


def test_paired_bootstrap_is_reproducible_and_checks_its_inputs():
    a, b = [1, 0, 1, 1, 0], [0, 0, 1, 0, 1]
    assert paired_bootstrap_interval(a, b, samples=500, seed=7) == paired_bootstrap_interval(a, b, samples=500, seed=7)
    with pytest.raises(ValueError, match="5 and 4"):
        paired_bootstrap_interval(a, b[:4], samples=10, seed=0)
    with pytest.raises(ValueError, match="strata has 2 labels for 5 pairs"):
        paired_bootstrap_interval(a, b, ["x", "y"], samples=10, seed=0)
    with pytest.raises(ValueError, match="samples=0"):
        paired_bootstrap_interval(a, b, samples=0, seed=0)


def test_cluster_bootstrap_degenerates_right():
    assert cluster_bootstrap_interval({"t": [1, 0, 1, 1]}, samples=500, seed=0) == (0.75, 0.75)
    assert cluster_bootstrap_interval({"a": [1, 1], "b": [1, 1, 1]}, samples=500, seed=0) == (1.0, 1.0)
    assert cluster_bootstrap_interval({"a": [0.0] * 4, "b": [0.0]}, samples=500, seed=0) == (0.0, 0.0)
    with pytest.raises(ValueError, match="empty clusters \\['b'\\]"):
        cluster_bootstrap_interval({"a": [1], "b": []}, samples=10, seed=0)
    with pytest.raises(ValueError, match="no clusters"):
        cluster_bootstrap_interval({}, samples=10, seed=0)


def test_cluster_bootstrap_resamples_whole_clusters_and_pools_their_episodes():
    # Two clusters: drawing (t1, t1), (t1, t2) or (t2, t2) gives pooled means 1, 10/40, 0 with
    # probabilities 1/4, 1/2, 1/4: the 2.5% and 97.5% percentiles are 0 and 1.
    assert cluster_bootstrap_interval({"t1": [1] * 10, "t2": [0] * 30}, samples=4000, seed=0) == (0.0, 1.0)
    # Unequal sizes: the pooled mean (not the mean of cluster means) against a plain loop.
    rng = np.random.default_rng(5)
    outcomes = {f"t{i}": list((rng.random(3 + 4 * i) < 0.1 * i).astype(float)) for i in range(10)}
    low, high = cluster_bootstrap_interval(outcomes, samples=4000, seed=11)
    loop = random.Random(11)
    clusters = list(outcomes.values())
    pooled = []
    for _ in range(4000):
        picks = loop.choices(clusters, k=len(clusters))
        pooled.append(sum(sum(c) for c in picks) / sum(len(c) for c in picks))
    pooled.sort()
    assert low == pytest.approx(pooled[100], abs=0.025) and high == pytest.approx(pooled[3899], abs=0.025)
