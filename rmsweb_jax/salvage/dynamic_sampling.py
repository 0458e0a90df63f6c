"""Dynamic sampling: draw states and sample groups until B groups pass the gates or the budget runs out.

    sampler = DynamicSampler(len(states), sample_fn, score_fn, settings)
    draw = sampler.draw()          # one update's groups: draw.accepted (<= B), draw.anchored
    state = sampler.get_state()    # saved with the step's checkpoint; set_state resumes exactly

States come in a seeded shuffled order, reshuffled every epoch (the order of epoch e is a
permutation drawn from (seed, e), so the resumable state is just (epoch, position, draws so far)).
Each round samples G responses for the next k states through `sample_fn` (any callable: the
salvage stage passes ChatModel.sample_groups over the states' prompts; tests pass a scripted
one), scores them with `score_fn`, routes the round's groups through gates.route_groups and
keeps going until B groups are accepted or `max_draws` states have been drawn. A round draws at
most B - accepted states, so a draw never holds more than B accepted groups and the rounds'
sizes depend only on what was accepted: the same seed and policy give the same draws. A draw
that ends short of B counts its shortfall (logged; the update trains with what there is).

Rejected groups are kept for the action-only anchor by `anchor`: "all" of them, only those
with no correct sample ("all_negative"), or none ("off").

A sample may be None (a failed or missing response): the group is then ragged, and the missing
samples are masked out of the advantage statistics (rewards beyond a short list likewise).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

import numpy as np
from absl import logging

from rmsweb_jax.errors import UserError
from rmsweb_jax.salvage.gates import GateSettings, route_groups
from rmsweb_jax.salvage.rewards import SampleScore

ANCHOR_MODES = ("all", "all_negative", "off")

# sample_fn(state indices, seed) -> one list of (up to) G samples per state (None = missing);
# score_fn(state index, the present samples) -> one SampleScore per sample.
SampleFn = Callable[[Sequence[int], int], Sequence[Sequence[Any]]]
ScoreFn = Callable[[int, Sequence[Any]], Sequence[SampleScore | None]]


@dataclasses.dataclass(frozen=True)
class DrawSettings:
    """config.salvage's sampling loop: G, B, the draw budget per update, the anchor mode, the seed."""

    group_size: int
    groups_per_step: int
    max_draws_per_step: int
    anchor: str
    seed: int

    def __post_init__(self):
        for name in ("group_size", "groups_per_step", "max_draws_per_step"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise UserError(f"config.salvage.{name} = {value!r}; expected an integer >= 1")
        if self.max_draws_per_step < self.groups_per_step:
            raise UserError(f"config.salvage.max_draws_per_step = {self.max_draws_per_step} < groups_per_step = "
                            f"{self.groups_per_step}: the budget could never fill a batch")
        if self.anchor not in ANCHOR_MODES:
            raise UserError(f"config.salvage.anchor = {self.anchor!r}; expected one of {list(ANCHOR_MODES)}")

    @classmethod
    def from_config(cls, salvage) -> "DrawSettings":
        """Returns the sampling-loop settings of the config.salvage block."""
        return cls(group_size=int(salvage.group_size), groups_per_step=int(salvage.groups_per_step),
                   max_draws_per_step=int(salvage.max_draws_per_step), anchor=str(salvage.anchor),
                   seed=int(salvage.seed))


@dataclasses.dataclass(frozen=True)
class Group:
    """One state's sampled group: its G samples (None = missing), their scores, validity, the
    advantages route_groups gave (0 when rejected) and whether it was accepted."""

    state_index: int
    samples: tuple[Any, ...]
    scores: tuple[SampleScore | None, ...]
    valid: np.ndarray       # [G] bool
    advantages: np.ndarray  # [G] float32
    accepted: bool

    @property
    def num_correct(self) -> int:
        """Returns how many valid samples are correct."""
        return sum(1 for s, v in zip(self.scores, self.valid) if v and s.correct)


@dataclasses.dataclass(frozen=True)
class Draw:
    """One update's worth of groups: `accepted` (<= B, in draw order), `anchored` (the rejected
    groups the anchor keeps), `rejected` (all rejected groups), how many states were drawn,
    the shortfall (B - accepted) and scalar metrics."""

    accepted: tuple[Group, ...]
    rejected: tuple[Group, ...]
    anchored: tuple[Group, ...]
    draws: int
    shortfall: int

    def metrics(self) -> dict[str, float]:
        """Returns the draw's scalars: groups accepted / rejected / anchored, states drawn, shortfall,
        mean reward and share of correct samples over every valid sample drawn."""
        groups = self.accepted + self.rejected
        scores = [s for g in groups for s, v in zip(g.scores, g.valid) if v]
        n = max(len(scores), 1)
        return {"groups_accepted": float(len(self.accepted)), "groups_rejected": float(len(self.rejected)),
                "groups_anchored": float(len(self.anchored)), "states_drawn": float(self.draws),
                "shortfall": float(self.shortfall), "reward_mean": sum(s.reward for s in scores) / n,
                "correct_share": sum(s.correct for s in scores) / n}


class DynamicSampler:
    """Draws states in a seeded shuffled order and samples, scores and gates their groups (see module)."""

    def __init__(self, num_states: int, sample_fn: SampleFn, score_fn: ScoreFn, settings: DrawSettings,
                 gates: GateSettings, *, impl: str | None = None):
        if num_states < 1:
            raise ValueError("the state set is empty: nothing to sample (rerun the mine stage?)")
        self.num_states, self.sample_fn, self.score_fn = int(num_states), sample_fn, score_fn
        self.settings, self.gates, self.impl = settings, gates, impl
        self.epoch, self.position, self.drawn = 0, 0, 0
        self.shortfall_total = 0
        self._order = self._permutation(0)

    # ---- state ----------------------------------------------------------------------------------------
    def get_state(self) -> dict[str, int]:
        """Returns the resumable state (JSON): epoch, position in its order, states drawn, shortfall so far."""
        return {"epoch": self.epoch, "position": self.position, "drawn": self.drawn,
                "shortfall_total": self.shortfall_total, "num_states": self.num_states, "seed": self.settings.seed}

    def set_state(self, state: dict) -> None:
        """Resumes at a state get_state returned (for the same state set and seed)."""
        if int(state["num_states"]) != self.num_states or int(state["seed"]) != self.settings.seed:
            raise ValueError(f"the sampler state was saved for {state['num_states']} states and seed {state['seed']}, "
                             f"this run has {self.num_states} states and config.salvage.seed = {self.settings.seed}: "
                             "resume with the same state set and seed")
        self.epoch, self.position = int(state["epoch"]), int(state["position"])
        self.drawn, self.shortfall_total = int(state["drawn"]), int(state["shortfall_total"])
        self._order = self._permutation(self.epoch)

    def _permutation(self, epoch: int) -> np.ndarray:
        return np.random.default_rng([self.settings.seed, epoch]).permutation(self.num_states)

    def _next_states(self, k: int) -> list[int]:
        out = []
        for _ in range(k):
            if self.position == self.num_states:
                self.epoch, self.position = self.epoch + 1, 0
                self._order = self._permutation(self.epoch)
            out.append(int(self._order[self.position]))
            self.position += 1
        return out

    # ---- drawing --------------------------------------------------------------------------------------
    def draw(self) -> Draw:
        """Returns the next update's groups: draws rounds until B are accepted or the budget is spent."""
        s = self.settings
        accepted: list[Group] = []
        rejected: list[Group] = []
        draws = 0
        while len(accepted) < s.groups_per_step and draws < s.max_draws_per_step:
            k = min(s.groups_per_step - len(accepted), s.max_draws_per_step - draws)
            states = self._next_states(k)
            # A fresh sampling key per round, from (seed, states drawn so far): below 2**31 for any int32 use.
            seed = int(np.random.SeedSequence([s.seed, self.drawn]).generate_state(1)[0]) >> 1
            self.drawn += k
            draws += k
            for group in self._round(states, seed):
                (accepted if group.accepted else rejected).append(group)
        shortfall = s.groups_per_step - len(accepted)
        if shortfall:
            self.shortfall_total += shortfall
            logging.warning("salvage: %d of %d groups accepted after %d states drawn (budget %d); %d short so far",
                            len(accepted), s.groups_per_step, draws, s.max_draws_per_step, self.shortfall_total)
        if s.anchor == "all":
            anchored = tuple(rejected)
        elif s.anchor == "all_negative":
            anchored = tuple(g for g in rejected if g.num_correct == 0)
        else:
            anchored = ()
        return Draw(tuple(accepted), tuple(rejected), anchored, draws, shortfall)

    def _round(self, states: list[int], seed: int) -> list[Group]:
        """Returns the groups of one round: sample, score, route."""
        g = self.settings.group_size
        sampled = list(self.sample_fn(states, seed))
        if len(sampled) != len(states):
            raise ValueError(f"sample_fn returned {len(sampled)} groups for {len(states)} states")
        rewards = np.zeros((len(states), g), np.float32)
        correct = np.zeros((len(states), g), bool)
        valid = np.zeros((len(states), g), bool)
        all_samples, all_scores = [], []
        for i, (state, samples) in enumerate(zip(states, sampled)):
            samples = tuple(samples)
            if len(samples) > g:
                raise ValueError(f"sample_fn returned {len(samples)} samples for state {state}; group_size is {g}")
            samples = samples + (None,) * (g - len(samples))
            present = [x for x in samples if x is not None]
            scored = list(self.score_fn(state, present)) if present else []
            if len(scored) != len(present):
                raise ValueError(f"score_fn returned {len(scored)} scores for state {state}'s {len(present)} samples")
            scored_iter = iter(scored)
            scores = tuple(None if x is None else next(scored_iter) for x in samples)
            for j, score in enumerate(scores):
                if score is not None:
                    rewards[i, j], correct[i, j], valid[i, j] = score.reward, score.correct, True
            all_samples.append(samples)
            all_scores.append(scores)
        routed = route_groups(rewards, correct, valid, self.gates, impl=self.impl)
        return [Group(state, all_samples[i], all_scores[i], valid[i], routed.advantages[i], bool(routed.accepted[i]))
                for i, state in enumerate(states)]
