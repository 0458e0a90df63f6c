"""The learners' parts without a model: a scripted rollout over a real state set and tokenizer, a stand-in
actor. Salvage-DS and plain GRPO see the same draws and differ exactly where their pieces differ: the reward,
which groups the gates keep, and the anchor rows."""
import types

import numpy as np
import pytest

from configs.common import base_config
from rmsweb_jax.data.batching import Buckets
from rmsweb_jax.errors import UserError
from rmsweb_jax.mining.state_set import StateSet
from rmsweb_jax.salvage.batches import OLD_LOGPROBS
from rmsweb_jax.salvage.learner import GRPOLearner, SalvageDSLearner, learner_class
from rmsweb_jax.salvage.state_prompts import StatePrompts
from rmsweb_jax.train.feeds import SINGLE
from tests.salvage.conftest import IMAGE_CONFIG, PROMPT
from tests.salvage.test_salvage_stage import write_states

G = 2
BUCKETS = Buckets((2560,), (640,), IMAGE_CONFIG.patch_dim, IMAGE_CONFIG.merge_size ** 2)


@pytest.fixture(scope="module")
def states(tmp_path_factory):
    folder = tmp_path_factory.mktemp("learner")
    write_states(folder)
    with StateSet(folder / "mine" / "states.arrayrecord") as state_set:
        yield state_set


class ScriptedRollout:
    """Even states: one correct sample (the reference turn) and one wrong; odd states: two wrong."""

    model = None
    resync_seconds = None

    def __init__(self, states, tokenizer):
        self.states, self.tokenizer, self.refreshed = states, tokenizer, 0

    def sample_groups(self, conversations, group_size, params, *, seed):
        return [self._group(self.indices[id(messages)], group_size) for messages in conversations]

    def _group(self, index, group_size):
        right = self.states[index].reference_text
        texts = ([right] if index % 2 == 0 else ["no action here"]) + ["no action here"] * (group_size - 1)
        return [types.SimpleNamespace(text=t, finish_reason="stop", token_ids=tuple(self.tokenizer.encode(t)))
                for t in texts]

    def refresh(self):
        self.refreshed += 1


class StandInActor:
    """The Trainer's side of the learner: log-probs, a step, a sync; records what it was given."""

    data_state = None
    feeds = SINGLE  # one process: it feeds every row

    def __init__(self, total_steps):
        self.settings = types.SimpleNamespace(total_steps=total_steps)
        self.step_count, self.steps, self.synced = 0, [], 0

    def token_logprobs(self, batch, params=None):
        return np.zeros(batch["input_ids"].shape, np.float32)

    def step(self, batch, data_state, host_metrics, *, can_save=True):
        self.steps.append((batch, data_state, host_metrics))
        self.step_count += 1

    def sync_model(self, model):
        self.synced += 1


def _learner(cls, states, tokenizer, *, gates="contrast_competence", anchor="all", total_steps=1, **salvage):
    cfg = base_config().salvage
    cfg.update(salvage)
    cfg.group_size, cfg.groups_per_step, cfg.max_draws_per_step = G, len(states), len(states)
    cfg.gates, cfg.anchor = gates, anchor
    prompts = StatePrompts(states, tokenizer, IMAGE_CONFIG, PROMPT)
    rollout = ScriptedRollout(states, tokenizer)
    # The rollout gets conversations, not indices: map each state's (cached) messages back to its index.
    rollout.indices = {id(prompts.context(i)[0]): i for i in range(len(states))}
    batch_size = len(states) * G * 2
    return cls(StandInActor(total_steps), rollout, prompts, cls.settings_from_config(cfg), sampling=None,
               buckets=BUCKETS, batch_size=batch_size, pad_id=0)


def test_grpo_keeps_the_groups_the_gates_drop_and_builds_no_anchor_rows(states, tokenizer):
    assert len(states) >= 2
    mixed = {i for i in range(len(states)) if i % 2 == 0}
    salvage = _learner(SalvageDSLearner, states, tokenizer)
    grpo = _learner(GRPOLearner, states, tokenizer)
    s_draw, g_draw = salvage.gate(), grpo.gate()
    # The same states drawn in the same order (same seed): only the pieces differ.
    assert s_draw.draws == g_draw.draws == len(states)
    assert sorted(g.state_index for g in s_draw.accepted + s_draw.rejected) == \
        sorted(g.state_index for g in g_draw.accepted)
    # Salvage-DS: the mixed groups pass contrast + competence; the all-wrong ones are rejected and anchored.
    assert {g.state_index for g in s_draw.accepted} == mixed
    assert {g.state_index for g in s_draw.anchored} == set(range(len(states))) - mixed
    # GRPO: every group is accepted, the all-wrong ones with zero advantages; none anchored.
    assert {g.state_index for g in g_draw.accepted} == set(range(len(states))) and not g_draw.anchored
    for group in g_draw.accepted:
        if group.state_index not in mixed:
            assert np.all(group.advantages == 0.0)
        else:
            assert group.advantages[0] > 0 > group.advantages[1]
    # The rewards: polarized +1 / -1 for Salvage-DS, binary 1 / 0 for GRPO, on the same correctness.
    s_rewards = {s.reward for g in s_draw.accepted + s_draw.rejected for s in g.scores}
    g_rewards = {s.reward for g in g_draw.accepted for s in g.scores}
    assert s_rewards == {1.0, -1.0} and g_rewards == {1.0, 0.0}
    s_policy, s_anchors, s_grounding = salvage.build_rows(s_draw)
    g_policy, g_anchors, g_grounding = grpo.build_rows(g_draw)
    assert s_grounding == g_grounding == []  # no grounding anchors unless given
    assert len(s_policy) == G * len(mixed) and len(s_anchors) == len(states) - len(mixed)
    assert len(g_policy) == G * len(states) and g_anchors == []
    assert all(row["anchor"] == 0.0 for row in g_policy)


def test_grpo_is_salvage_ds_with_gates_none_when_advantages_are_standardised(states, tokenizer):
    # Why the table has no separate GRPO row (stages/table.py): binary 1/0 and polarized +-1 rewards give the same
    # standardised advantages (up to the std's epsilon), and with no gate rejecting a group the anchor never acts.
    salvage = _learner(SalvageDSLearner, states, tokenizer, gates="none", anchor="all")
    grpo = _learner(GRPOLearner, states, tokenizer)
    s_draw, g_draw = salvage.gate(), grpo.gate()
    assert not s_draw.rejected and not s_draw.anchored
    s_adv = {g.state_index: g.advantages for g in s_draw.accepted}
    g_adv = {g.state_index: g.advantages for g in g_draw.accepted}
    assert set(s_adv) == set(g_adv) == set(range(len(states)))
    for index, advantages in g_adv.items():
        np.testing.assert_allclose(s_adv[index], advantages, atol=1e-4)
    s_policy, s_anchors, _ = salvage.build_rows(s_draw)
    g_policy, g_anchors, _ = grpo.build_rows(g_draw)
    assert s_anchors == g_anchors == [] and len(s_policy) == len(g_policy)
    # Without standardisation (config.salvage.std_normalize = False) they differ: +-1 doubles every advantage.
    s_raw = _learner(SalvageDSLearner, states, tokenizer, gates="none", std_normalize=False).gate()
    g_raw = _learner(GRPOLearner, states, tokenizer, std_normalize=False).gate()
    for s_group, g_group in zip(s_raw.accepted, g_raw.accepted):
        assert s_group.state_index == g_group.state_index
        np.testing.assert_allclose(s_group.advantages, 2 * g_group.advantages, atol=1e-6)
    assert any(np.abs(g.advantages).max() > 0 for g in g_raw.accepted)


def test_grpo_ignores_the_gate_and_anchor_keys(states, tokenizer):
    grpo = _learner(GRPOLearner, states, tokenizer, gates="contrast", anchor="all_negative")
    assert (grpo.settings.gates.gates, grpo.settings.draw.anchor) == ("none", "off")
    assert "reward binary, gates none, anchor off" in grpo.describe()


def test_an_update_runs_the_parts_in_order(states, tokenizer):
    learner = _learner(SalvageDSLearner, states, tokenizer, total_steps=2)
    totals = learner.run()
    actor, rollout = learner.actor, learner.rollout
    assert len(actor.steps) == 2 and actor.synced == 2 and rollout.refreshed == 2
    batch, data_state, metrics = actor.steps[-1]
    assert OLD_LOGPROBS in batch and data_state == learner.sampler.get_state()
    assert metrics["rows_policy_rows"] == G * metrics["groups_accepted"]
    assert metrics["rows_anchor_rows"] == metrics["groups_anchored"]
    assert totals["states_drawn"] == 2 * len(states) and totals["shortfall"] == 2 * metrics["shortfall"]


def test_the_algorithm_key_picks_the_learner():
    assert learner_class(base_config().salvage.algorithm) is SalvageDSLearner
    assert learner_class("grpo") is GRPOLearner
    with pytest.raises(UserError, match=r"config.salvage.algorithm = 'dapo': expected one of \['grpo', 'salvage_ds'\]"):
        learner_class("dapo")


def test_state_prompts_cache_per_instance_and_let_go(states, tokenizer):
    import gc
    import weakref
    prompts = StatePrompts(states, tokenizer, IMAGE_CONFIG, PROMPT)
    assert prompts.prompt(0) is prompts.prompt(0)
    other = StatePrompts(states, tokenizer, IMAGE_CONFIG, PROMPT)
    assert other.prompt(0) is not prompts.prompt(0)  # no cache shared between instances
    gone = weakref.ref(prompts)
    del prompts
    gc.collect()
    assert gone() is None  # nothing at class or module level keeps an instance alive
