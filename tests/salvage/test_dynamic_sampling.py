"""salvage.dynamic_sampling: stops at B accepted or at the budget, covers the state order, is
deterministic, resumes exactly, keeps the right rejected groups for the anchor, handles ragged groups.

The sampler here is scripted (state s yields a known number of correct samples), so which groups
the real gates accept is known in advance; the gates and the kernel are the real ones."""
import json

import numpy as np
import pytest

from configs.common import base_config
from rmsweb_jax.salvage.dynamic_sampling import DrawSettings, DynamicSampler
from rmsweb_jax.salvage.gates import GateSettings
from rmsweb_jax.salvage.rewards import SampleScore

G = 8


def n_correct(state):
    """States s % 3 == 0 have 4 of 8 right (accepted by every gate), s % 3 == 1 none (all wrong),
    s % 3 == 2 one (contrast only)."""
    return (4, 0, 1)[state % 3]


class Scripted:
    """sample_fn: G samples per state; records every call (states, seed)."""

    def __init__(self, missing=None, correct_of=n_correct):
        self.calls = []
        self.missing = missing or {}
        self.correct_of = correct_of

    def __call__(self, states, seed):
        self.calls.append((tuple(states), seed))
        out = []
        for s in states:
            samples = [(s, j < self.correct_of(s), seed) for j in range(G)]
            for j in self.missing.get(s, ()):
                samples[j] = None
            out.append(samples)
        return out


def score(state, samples):
    assert all(x[0] == state for x in samples)
    return [SampleScore(c, 1.0 if c else -1.0, "same" if c else "wrong_point") for _, c, _ in samples]


def make(num_states=30, gates="contrast_competence", sample_fn=None, **kw):
    salvage = base_config().salvage
    salvage.gates = gates
    salvage.group_size = G
    for k, v in {"groups_per_step": 3, "max_draws_per_step": 12, **kw}.items():
        setattr(salvage, k, v)
    return DynamicSampler(num_states, sample_fn or Scripted(), score, DrawSettings.from_config(salvage),
                          GateSettings.from_config(salvage))


def drawn_states(draw):
    return [g.state_index for g in (*draw.accepted, *draw.rejected)]


def test_stops_at_b_accepted():
    sampler = make()
    for _ in range(5):
        draw = sampler.draw()
        assert len(draw.accepted) == 3 and draw.shortfall == 0
        assert all(n_correct(g.state_index) == 4 for g in draw.accepted)
        assert all(n_correct(g.state_index) != 4 for g in draw.rejected)
        assert draw.draws == len(draw.accepted) + len(draw.rejected) <= 12
        # It stopped as soon as it had B: no state was drawn after the B-th accepted one.
        order = sampler.sample_fn.calls
        assert order[-1][0][-1] in [g.state_index for g in draw.accepted]


def test_stops_at_the_budget_and_counts_the_shortfall():
    nothing_right = make(max_draws_per_step=5, groups_per_step=2, sample_fn=Scripted(correct_of=lambda s: 0))
    d = nothing_right.draw()
    assert d.accepted == () and d.draws == 5 and d.shortfall == 2 and len(d.rejected) == 5
    sampler = make(num_states=30, max_draws_per_step=4, groups_per_step=3)
    draws = [sampler.draw() for _ in range(8)]
    for d in draws:
        assert d.draws <= 4
        if d.shortfall:
            assert d.draws == 4 and len(d.accepted) == 3 - d.shortfall
    assert sum(d.shortfall for d in draws) == sampler.get_state()["shortfall_total"] > 0


def test_every_epoch_visits_every_state_once_in_a_fresh_order():
    sampler = make(num_states=9, gates="none", groups_per_step=3, max_draws_per_step=3)
    seen = [drawn_states(sampler.draw()) for _ in range(6)]  # "none" accepts all: 3 states per draw
    epoch0, epoch1 = sum(seen[:3], []), sum(seen[3:], [])
    assert sorted(epoch0) == sorted(epoch1) == list(range(9))
    assert epoch0 != epoch1
    assert sampler.get_state()["epoch"] == 1


def test_same_seed_same_draws_other_seed_other_order():
    a, b, c = make(), make(), make(seed=1)
    da, db, dc = ([drawn_states(s.draw()) for _ in range(4)] for s in (a, b, c))
    assert da == db and a.sample_fn.calls == b.sample_fn.calls
    assert da != dc
    seeds = [seed for _, seed in a.sample_fn.calls]
    assert len(set(seeds)) == len(seeds)  # every round samples with its own key


def test_resumes_exactly_from_a_saved_state():
    first = make()
    first.draw()
    state = json.loads(json.dumps(first.get_state()))  # saved with a checkpoint as JSON
    later = [first.draw() for _ in range(3)]
    resumed = make()
    resumed.set_state(state)
    again = [resumed.draw() for _ in range(3)]
    for x, y in zip(later, again):
        assert drawn_states(x) == drawn_states(y)
        for gx, gy in zip(x.accepted, y.accepted):
            assert gx.samples == gy.samples  # the same sampling seeds
            np.testing.assert_array_equal(gx.advantages, gy.advantages)
    assert resumed.get_state() == first.get_state()
    with pytest.raises(ValueError, match="same state set and seed"):
        make(num_states=31).set_state(state)


@pytest.mark.parametrize("anchor, want", [("all", {0, 1}), ("all_negative", {0}), ("off", set())])
def test_anchor_keeps_the_configured_rejected_groups(anchor, want):
    # contrast_competence rejects n_correct 0 (s % 3 == 1) and 1 (s % 3 == 2)
    sampler = make(anchor=anchor, groups_per_step=3, max_draws_per_step=30)
    draw = sampler.draw()
    kinds = {0 if n_correct(g.state_index) == 0 else 1 for g in draw.anchored}
    assert kinds <= want
    if anchor == "all":
        assert draw.anchored == draw.rejected
    assert all(g.num_correct == 0 for g in draw.anchored) or anchor == "all"
    assert all(np.all(g.advantages == 0.0) for g in draw.rejected)
    # What it keeps, exactly: every rejected group of a wanted kind, in draw order, and the draw saw both kinds.
    assert {0, 1} <= {0 if n_correct(g.state_index) == 0 else 1 for g in draw.rejected}
    kept = [g for g in draw.rejected if (0 if n_correct(g.state_index) == 0 else 1) in want]
    assert [g.state_index for g in draw.anchored] == [g.state_index for g in kept]
    assert draw.metrics()["groups_anchored"] == len(kept)


def test_ragged_groups_are_masked():
    # State 3 (4 correct) loses samples 0-2 (correct ones): 1 correct of 5 -> competence rejects it.
    # State 6 (4 correct) loses sample 7 only: 4 of 7 -> accepted.
    sampler = make(num_states=9, gates="contrast_competence", groups_per_step=9, max_draws_per_step=9,
                   sample_fn=Scripted(missing={3: (0, 1, 2), 6: (7,)}))
    draw = sampler.draw()
    groups = {g.state_index: g for g in (*draw.accepted, *draw.rejected)}
    assert not groups[3].accepted and groups[3].valid.sum() == 5 and groups[3].samples[0] is None
    assert groups[6].accepted and groups[6].valid.sum() == 7 and groups[6].advantages[7] == 0.0
    assert np.all(groups[6].advantages[:4] > 0) and np.all(groups[6].advantages[4:7] < 0)


def test_metrics():
    draw = make(gates="contrast", groups_per_step=2, max_draws_per_step=10).draw()
    m = draw.metrics()
    assert m["groups_accepted"] == 2 and m["groups_rejected"] + 2 == m["states_drawn"]
    n = sum(int(g.valid.sum()) for g in (*draw.accepted, *draw.rejected))
    right = sum(g.num_correct for g in (*draw.accepted, *draw.rejected))
    assert m["correct_share"] == pytest.approx(right / n)
    assert m["reward_mean"] == pytest.approx((right - (n - right)) / n)


@pytest.mark.parametrize("kw, match", [
    (dict(group_size=0), "group_size"),
    (dict(max_draws_per_step=2, groups_per_step=3), "never fill"),
    (dict(anchor="some"), "anchor"),
])
def test_bad_settings(kw, match):
    base = dict(group_size=8, groups_per_step=3, max_draws_per_step=12, anchor="all", seed=0)
    with pytest.raises(ValueError, match=match):
        DrawSettings(**{**base, **kw})
