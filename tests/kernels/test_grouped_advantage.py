"""kernels.grouped_advantage: reference vs float64 NumPy oracle; Pallas (interpret) vs reference."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernels import grouped_advantage as ga

GATES = dict(eps=1e-6, std_normalize=True, ddof=0, contrast_std_min=0.3,
             competence_min=0.2, competence_max=0.8)


def oracle(rewards, mask, *, eps, std_normalize, ddof, contrast_std_min, competence_min,
           competence_max, correct=None, positive_threshold=0.0):
    """Returns dict of per-group results, one group at a time in float64; a member is positive
    when correct[i, j] (given) or reward > positive_threshold."""
    out = {k: [] for k in ("mean", "std", "count", "competence_frac", "contrast", "competence")}
    adv = np.zeros(rewards.shape)
    for i, (r, m) in enumerate(zip(rewards.astype(np.float64), mask)):
        x = r[m]
        n = len(x)
        mean = x.mean() if n else 0.0
        std = np.sqrt(((x - mean) ** 2).sum() / max(n - ddof, 1)) if n else 0.0
        centered = x - mean
        adv[i, m] = centered / (std + eps) if std_normalize else centered
        positive = x > positive_threshold if correct is None else np.asarray(correct[i], bool)[m]
        n_pos = int(positive.sum())
        frac = n_pos / max(n, 1)
        out["mean"].append(mean)
        out["std"].append(std)
        out["count"].append(n)
        out["competence_frac"].append(frac)
        out["contrast"].append(0 < n_pos < n and std > contrast_std_min)
        out["competence"].append(n > 0 and competence_min <= frac <= competence_max)
    out = {k: np.array(v) for k, v in out.items()}
    out["advantages"] = adv
    return out


def assert_stats_close(stats: ga.GroupStats, expected: dict, atol=1e-5):
    for name in ("mean", "std", "count", "competence_frac", "advantages"):
        np.testing.assert_allclose(np.asarray(getattr(stats, name)), expected[name], atol=atol,
                                   rtol=1e-5, err_msg=name)
    for name in ("contrast", "competence"):
        np.testing.assert_array_equal(np.asarray(getattr(stats, name)), expected[name],
                                      err_msg=name)


# Rewards on a coarse grid keep float32 sums exact, so flags compare exactly with float64.
GRID = [-1.0, -0.5, 0.0, 0.25, 1.0, 2.0]


@settings(max_examples=40, deadline=None)
@given(data=st.data(), g=st.sampled_from([1, 3, 8]), ddof=st.sampled_from([0, 1]),
       std_normalize=st.booleans())
def test_reference_matches_float64_oracle(data, g, ddof, std_normalize):
    n = 12  # fixed shapes keep compiles few; the mask makes groups ragged or empty
    rewards = np.array(data.draw(st.lists(st.sampled_from(GRID), min_size=n * g,
                                          max_size=n * g)), np.float32).reshape(n, g)
    mask = np.array(data.draw(st.lists(st.booleans(), min_size=n * g, max_size=n * g)))
    mask = mask.reshape(n, g)
    gates = dict(GATES, ddof=ddof, std_normalize=std_normalize)
    stats = ga.grouped_advantages(rewards, mask, impl="reference", **gates)
    assert_stats_close(stats, oracle(rewards, mask, **gates))


def test_all_equal_groups_give_exactly_zero_advantage():
    # Values whose float32 mean is not exact without the pivot (0.1 * 3 / 3 != 0.1).
    values = np.array([0.1, 1 / 3, -7.3, 1e4 + 0.1, 0.0, -1.0], np.float32)
    rewards = np.repeat(values[:, None], 7, axis=1)
    mask = np.ones_like(rewards, bool)
    mask[1, 3:] = False
    for impl in ("reference", "pallas_interpret"):
        stats = ga.grouped_advantages(rewards, mask, impl=impl, block_groups=128)
        assert np.all(np.asarray(stats.advantages) == 0.0), impl
        assert np.all(np.asarray(stats.std) == 0.0), impl
        np.testing.assert_array_equal(np.asarray(stats.mean), values)
        assert not np.asarray(stats.contrast).any()


def ragged_batch(seed=0, n=300, g=8):
    """Returns rewards/mask covering the edge cases, masked members holding NaN."""
    rng = np.random.default_rng(seed)
    rewards = rng.normal(size=(n, g)).astype(np.float32)
    mask = rng.random((n, g)) > 0.3
    rewards[:20] = rng.choice([-1.0, 1.0], size=(20, g))  # Salvage-DS style +-1 scores
    mask[20] = False  # empty group
    mask[21] = False
    mask[21, 2] = True  # a single member
    rewards[22] = 0.7  # all equal
    mask[22] = True
    rewards[23] = np.abs(rewards[23])  # all positive, non-constant
    mask[23] = True
    rewards[~mask] = np.nan  # masked members must never reach a sum
    return rewards, mask


@pytest.mark.parametrize("platform", ["tpu", "gpu"])
def test_pallas_matches_reference_on_edge_cases(platform):
    rewards, mask = ragged_batch()
    gates = ga.Gates(**GATES)
    ref = ga._reference_arrays(jnp.asarray(rewards), jnp.asarray(mask, jnp.float32), gates)
    out = ga.grouped_arrays_pallas(jnp.asarray(rewards), jnp.asarray(mask, jnp.float32), gates,
                                   platform, True, 128 if platform == "tpu" else 64)
    for name, a, b in zip(("mean", "std", "count", "frac", "contrast", "competence", "adv"),
                          ref, out):
        assert not np.isnan(np.asarray(b)).any(), name
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), atol=1e-5, rtol=1e-5,
                                   err_msg=name)
    # And both agree with the oracle on the semantics.
    clean = np.where(mask, rewards, 0.0)
    assert_stats_close(ga._to_stats(out), oracle(clean, mask, **GATES))


@pytest.mark.parametrize("g", [1, 5])
def test_pallas_handles_small_and_odd_group_sizes(g):
    rng = np.random.default_rng(g)
    rewards = rng.choice([-1.0, 0.5, 1.0], size=(40, g)).astype(np.float32)
    mask = rng.random((40, g)) > 0.2
    ref = ga.grouped_advantages(rewards, mask, impl="reference", **GATES)
    out = ga.grouped_advantages(rewards, mask, impl="pallas_interpret", **GATES)
    for name in ga.GroupStats._fields:
        np.testing.assert_allclose(np.asarray(getattr(out, name), np.float64),
                                   np.asarray(getattr(ref, name), np.float64), atol=1e-5,
                                   err_msg=name)
    if g == 1:  # one member: advantage 0, std 0, never contrast
        assert np.all(np.asarray(out.advantages) == 0.0)
        assert not np.asarray(out.contrast).any()


@pytest.mark.slow  # each new shape compiles the kernel in interpret mode
@settings(max_examples=5, deadline=None)
@given(n=st.integers(1, 300), g=st.integers(1, 12), seed=st.integers(0, 100),
       platform=st.sampled_from(["tpu", "gpu"]))
def test_pallas_random_shapes_match_reference(n, g, seed, platform):
    rng = np.random.default_rng(seed)
    rewards = rng.choice([-1.0, 0.0, 0.5, 1.0], size=(n, g)).astype(np.float32)
    valid = (rng.random((n, g)) > 0.3).astype(np.float32)
    gates = ga.Gates(**GATES)
    ref = ga._reference_arrays(jnp.asarray(rewards), jnp.asarray(valid), gates)
    out = ga.grouped_arrays_pallas(jnp.asarray(rewards), jnp.asarray(valid), gates, platform,
                                   True, None)
    for a, b in zip(ref, out):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), atol=1e-5, rtol=1e-5)


def naive_stats(rewards, mask, eps):
    """Returns (mean, std, advantages) by the textbook formulas (no pivot, no guards)."""
    m = mask.astype(jnp.float32)
    n = m.sum(-1)
    mean = (rewards * m).sum(-1) / n
    std = jnp.sqrt((((rewards - mean[:, None]) * m) ** 2).sum(-1) / n)
    return mean, std, (rewards - mean[:, None]) / (std[:, None] + eps) * m


def test_pallas_gradients_match_naive_autodiff():
    rng = np.random.default_rng(1)
    rewards = jnp.asarray(rng.normal(size=(50, 6)), jnp.float32)
    mask = jnp.asarray(rng.random((50, 6)) > 0.25).at[:, :2].set(True)
    c = [jnp.asarray(rng.normal(size=s), jnp.float32) for s in [(50,), (50,), (50, 6)]]

    def loss(stats):
        mean, std, adv = stats
        return jnp.sum(mean * c[0]) + jnp.sum(std * c[1]) + jnp.sum(adv * c[2])

    def ours(r):
        s = ga.grouped_advantages(r, mask, impl="pallas_interpret", eps=1e-6)
        return loss((s.mean, s.std, s.advantages))

    expected = jax.jit(jax.grad(lambda r: loss(naive_stats(r, mask, 1e-6))))(rewards)
    got = jax.jit(jax.grad(ours))(rewards)
    np.testing.assert_allclose(np.asarray(got), np.asarray(expected), atol=1e-5, rtol=1e-5)
    ref_grad = jax.jit(jax.grad(lambda r: loss(tuple(
        getattr(ga.grouped_advantages(r, mask, impl="reference"), f)
        for f in ("mean", "std", "advantages")))))(rewards)
    np.testing.assert_allclose(np.asarray(ref_grad), np.asarray(expected), atol=1e-5, rtol=1e-5)


def test_default_on_cpu_is_the_reference_and_jits():
    rewards, mask = ragged_batch(n=30)
    fn = jax.jit(lambda r, m: ga.grouped_advantages(r, m))
    assert "pallas_call" not in str(jax.make_jaxpr(fn)(rewards, mask))
    got = fn(rewards, mask)
    ref = ga.grouped_advantages(rewards, mask, impl="reference")
    np.testing.assert_allclose(np.asarray(got.advantages), np.asarray(ref.advantages),
                               atol=1e-6)
    # No mask means every member is valid.
    full = ga.grouped_advantages(np.ones((3, 4), np.float32))
    np.testing.assert_array_equal(np.asarray(full.count), [4, 4, 4])


@pytest.mark.parametrize("kwargs, match", [
    (dict(rewards=np.zeros(4)), "rewards must be"),
    (dict(rewards=np.zeros((2, 4)), mask=np.ones((2, 3))), "mask shape"),
    (dict(rewards=np.zeros((2, 4)), competence_min=0.9, competence_max=0.1), "competence_min"),
    (dict(rewards=np.zeros((2, 4)), ddof=2), "ddof"),
    (dict(rewards=np.zeros((2, 4)), eps=-1.0), "eps"),
    (dict(rewards=np.zeros((2, 4)), impl="chunked"), "impl"),
    (dict(rewards=np.zeros((2, 4)), impl="pallas"), "pallas_interpret"),
    (dict(rewards=np.zeros((2, 4)), impl="pallas_interpret", block_groups=100), "block_groups"),
])
def test_bad_inputs_raise_value_error(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ga.grouped_advantages(**kwargs)


# ----------------------------------------------------------------------------- correctness flags


def correctness_batch(seed=0, n=200, g=8):
    """Returns (rewards, mask, correct) where correctness disagrees with the reward's sign:
    partial-credit-like rewards in [0, 1] (all positive) with sparse correct flags, and graded
    rewards in (-1, 0) for incorrect members."""
    rng = np.random.default_rng(seed)
    correct = rng.random((n, g)) < 0.4
    rewards = np.where(correct, 1.0, rng.choice([0.2, 0.5, 0.75], size=(n, g))).astype(np.float32)
    rewards[n // 2:] = np.where(correct[n // 2:], 1.0, rng.choice([-1.0, -0.5], size=(n - n // 2, g)))
    mask = rng.random((n, g)) > 0.2
    correct[0] = True  # all correct: no contrast
    correct[1] = False  # all wrong, rewards differ (graded): still no contrast
    mask[1] = True
    rewards[1] = np.linspace(0.1, 0.8, g)
    mask[2] = False  # empty
    return rewards, mask, correct


@pytest.mark.parametrize("impl", ["reference", "pallas_interpret"])
def test_correct_flags_decide_contrast_and_competence(impl):
    rewards, mask, correct = correctness_batch()
    gates = dict(GATES, contrast_std_min=0.0, competence_min=0.25, competence_max=0.75)
    stats = ga.grouped_advantages(rewards, mask, correct=correct, impl=impl, block_groups=128, **gates)
    expected = oracle(rewards, mask, correct=correct, **gates)
    assert_stats_close(stats, expected)
    # All rewards of the first half are > 0, so reward > 0 would call every group all-positive.
    by_sign = ga.grouped_advantages(rewards, mask, impl=impl, block_groups=128, **gates)
    half = len(rewards) // 2
    assert not np.asarray(by_sign.contrast[:half]).any()
    assert np.asarray(stats.contrast[:half]).any()
    assert not bool(stats.contrast[1]) and float(stats.std[1]) > 0  # varied wrong rewards: no contrast
    assert not bool(stats.contrast[0]) and not bool(stats.competence[2])
    # The advantages do not depend on the flags.
    np.testing.assert_array_equal(np.asarray(stats.advantages), np.asarray(by_sign.advantages))


@pytest.mark.parametrize("platform", ["tpu", "gpu"])
def test_pallas_with_correct_flags_matches_reference(platform):
    rewards, mask, correct = correctness_batch(seed=3, n=300)
    gates = ga.Gates(**dict(GATES, competence_min=0.125, competence_max=0.875))
    args = (jnp.asarray(rewards), jnp.asarray(mask, jnp.float32))
    c = jnp.asarray(correct, jnp.float32)
    ref = ga._reference_arrays(*args, gates, c)
    out = ga.grouped_arrays_pallas(*args, gates, platform, True, 128 if platform == "tpu" else 64, c)
    for name, a, b in zip(("mean", "std", "count", "frac", "contrast", "competence", "adv"), ref, out):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), atol=1e-5, rtol=1e-5, err_msg=name)


@pytest.mark.parametrize("impl", ["reference", "pallas_interpret"])
def test_positive_threshold_replaces_reward_above_zero(impl):
    rewards = np.array([[0.2, 0.6, 0.9, 0.3], [0.1, 0.2, 0.3, 0.4], [0.6, 0.7, 0.8, 0.9]], np.float32)
    stats = ga.grouped_advantages(rewards, impl=impl, positive_threshold=0.5, block_groups=128)
    np.testing.assert_allclose(np.asarray(stats.competence_frac), [0.5, 0.0, 1.0])
    np.testing.assert_array_equal(np.asarray(stats.contrast), [True, False, False])
    expected = oracle(rewards, np.ones_like(rewards, bool), eps=1e-6, std_normalize=True, ddof=0,
                      contrast_std_min=0.0, competence_min=0.0, competence_max=1.0, positive_threshold=0.5)
    assert_stats_close(stats, expected)


def test_pallas_gradients_with_correct_flags_match_reference():
    rewards, mask, correct = correctness_batch(seed=5, n=40, g=6)
    weights = jnp.asarray(np.random.default_rng(0).normal(size=rewards.shape), jnp.float32)

    def loss(r, impl):
        s = ga.grouped_advantages(r, mask, correct=correct, impl=impl)
        return jnp.sum(s.advantages * weights) + jnp.sum(s.std)

    got = jax.grad(lambda r: loss(r, "pallas_interpret"))(jnp.asarray(rewards))
    want = jax.grad(lambda r: loss(r, "reference"))(jnp.asarray(rewards))
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-5, rtol=1e-5)


def test_correct_shape_must_match():
    with pytest.raises(ValueError, match="correct shape"):
        ga.grouped_advantages(np.zeros((2, 4)), correct=np.ones((2, 3), bool))


@pytest.mark.parametrize("platform", ["tpu", "gpu"])
def test_kernel_with_correct_flags_lowers(platform):
    from tests.kernels.test_kernel_lowering import lower
    fn = lambda r, m, c: ga.grouped_arrays_pallas(r, m, ga.Gates(), platform, False, None, c)  # noqa: E731
    shape = jax.ShapeDtypeStruct((1000, 8), jnp.float32)
    module = lower(fn, platform, shape, shape, shape)
    assert ("tpu_custom_call" if platform == "tpu" else "triton") in module
