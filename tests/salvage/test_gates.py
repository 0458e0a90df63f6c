"""salvage.gates: every gate on hand-built groups, and the invariants on random ones (accepted groups
never all-zero under contrast gates, rejected groups exactly zero, plain GRPO's all-equal groups zero)."""
import numpy as np
import pytest

from configs.common import base_config
from rmsweb_jax.salvage.gates import GATES, GateSettings, route_groups


def gate(name, **kw):
    salvage = base_config().salvage
    salvage.gates = name
    for k, v in kw.items():
        setattr(salvage, k, v)
    return GateSettings.from_config(salvage)


# Groups of G = 8 under the polarized reward (reward = +1 if correct else -1).
N_CORRECT = [0, 1, 2, 4, 6, 7, 8]


def polarized_groups(n_correct=N_CORRECT, g=8):
    correct = np.zeros((len(n_correct), g), bool)
    for i, k in enumerate(n_correct):
        correct[i, :k] = True
    return np.where(correct, 1.0, -1.0).astype(np.float32), correct


@pytest.mark.parametrize("name, want", [
    ("none", [True] * 7),
    ("contrast", [False, True, True, True, True, True, False]),
    # Shipped competence range [0.25, 0.75]: also rejects a lone hit (1/8) and a lone slip (7/8).
    ("contrast_competence", [False, False, True, True, True, False, False]),
])
def test_gates_route_groups_by_number_correct(name, want):
    rewards, correct = polarized_groups()
    routed = route_groups(rewards, correct, None, gate(name))
    np.testing.assert_array_equal(routed.accepted, want)
    assert np.all(routed.advantages[~routed.accepted] == 0.0)
    for i in np.flatnonzero(routed.accepted):
        if 0 < N_CORRECT[i] < 8:
            assert np.all(np.sign(routed.advantages[i]) == np.where(correct[i], 1, -1))
    # Plain GRPO: all-equal groups are accepted but train nothing.
    if name == "none":
        assert np.all(routed.advantages[[0, 6]] == 0.0)


def test_default_competence_is_a_real_gate_for_the_default_group_size():
    """With the shipped G, some group contrast accepts must fail competence (else it gates nothing)."""
    c = base_config().salvage
    g = c.group_size
    rewards, correct = polarized_groups(list(range(g + 1)), g)
    contrast = route_groups(rewards, correct, None, gate("contrast")).accepted
    both = route_groups(rewards, correct, None, gate("contrast_competence")).accepted
    assert (contrast & ~both).any()
    assert both.any()


def test_correctness_not_reward_sign_decides_under_partial_credit():
    # Partial-credit rewards are all positive; only sample 0 of group 0 is correct.
    rewards = np.array([[1.0, 0.6, 0.4, 0.6], [0.6, 0.6, 0.4, 0.2]], np.float32)
    correct = np.array([[True, False, False, False], [False] * 4])
    routed = route_groups(rewards, correct, None, gate("contrast"))
    np.testing.assert_array_equal(routed.accepted, [True, False])
    assert routed.advantages[0, 0] > 0 and np.all(routed.advantages[1] == 0.0)
    # Graded: all wrong with different near-miss values is no contrast, whatever the std.
    graded = np.array([[-0.5, -1.0, -0.5, -1.0]], np.float32)
    routed = route_groups(graded, np.zeros((1, 4), bool), None, gate("contrast"))
    assert not routed.accepted[0] and float(routed.stats.std[0]) > 0


def test_ragged_groups_go_through_the_mask():
    rewards, correct = polarized_groups([2, 2])
    mask = np.ones_like(correct)
    mask[1, :2] = False  # group 1 loses its two correct samples: all wrong, no contrast
    mask[0, 5:] = False  # group 0: 2 of 5 correct
    routed = route_groups(rewards, correct, mask, gate("contrast_competence"))
    np.testing.assert_array_equal(routed.accepted, [True, False])
    assert np.all(routed.advantages[0, 5:] == 0.0) and np.all(routed.advantages[0, :5] != 0.0)
    np.testing.assert_allclose(routed.stats.competence_frac, [0.4, 0.0])


@pytest.mark.parametrize("name", GATES)
@pytest.mark.parametrize("seed", range(3))
def test_invariants_on_random_groups(name, seed):
    rng = np.random.default_rng(seed)
    n, g = 64, 8
    correct = rng.random((n, g)) < rng.random((n, 1))
    graded = rng.choice([-0.5, -1.0], size=(n, g))
    rewards = np.where(correct, 1.0, graded).astype(np.float32)
    mask = rng.random((n, g)) > 0.15
    routed = route_groups(rewards, correct, mask, gate(name))
    assert np.all(routed.advantages[~routed.accepted] == 0.0)
    assert np.all(routed.advantages[~mask] == 0.0)
    if name != "none":
        assert routed.accepted.any()
        assert np.all(np.abs(routed.advantages[routed.accepted]).max(axis=1) > 0)
        for i in np.flatnonzero(routed.accepted):
            k, c = mask[i].sum(), (correct[i] & mask[i]).sum()
            assert 0 < c < k
            if name == "contrast_competence":
                assert 0.25 <= c / k <= 0.75
    else:
        np.testing.assert_array_equal(routed.accepted, mask.any(axis=1))


@pytest.mark.parametrize("kw, match", [
    (dict(gates="dapo"), "config.salvage.gates"),
    (dict(competence_min=0.9, competence_max=0.5), "competence_min"),
    (dict(contrast_std_min=-1.0), "contrast_std_min"),
])
def test_bad_settings(kw, match):
    base = dict(gates="contrast", contrast_std_min=0.0, competence_min=0.0, competence_max=1.0, std_normalize=True)
    with pytest.raises(ValueError, match=match):
        GateSettings(**{**base, **kw})
