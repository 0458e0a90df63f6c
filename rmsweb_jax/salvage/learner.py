"""Group-relative RL as a learner object: Salvage-DS (`SalvageDSLearner`) and plain GRPO (`GRPOLearner`).

    learner = learner_class(config.salvage.algorithm)(actor, rollout, prompts, settings, ...)
    totals = learner.run()         # updates until the actor's total_steps

The roles, as tunix's GRPOLearner holds them: the actor (train/loop.py Trainer: parameters, optimizer,
checkpoints, metrics), the rollout model (sampling/chat_model.py ChatModel, sampling from the actor's
current weights) and the reference (the frozen SFT parameters, only when the loss has a KL term). One
update is one method per part, in this order:

    sample_groups -> score -> gate      DynamicSampler.draw over `sample_groups` and `score`, gated by the
                                        settings' gates (salvage/dynamic_sampling.py, gates.py)
    build_rows                          policy rows of the accepted groups, anchor rows of the anchored
                                        ones, as one padded batch (salvage/batches.py)
    old_logprobs                        the actor's own log-probs of the exact rows (and the reference's)
    update                              `epochs` optimizer steps on the batch (config.salvage.epochs, default 1;
                                        from the second the importance ratio leaves 1; the sampler's state saved
                                        with the last)
    sync                                the rollout model refreshed from the new parameters (the step
                                        donated the old ones)

Each update's metrics time its parts (seconds, as verl's timing_s/*): `draw_s` (sample, score, gate), `batch_s`
(build the rows and their old log-probs) and `sync_s` (the previous update's sync: the metrics are handed to the
trainer before this update's sync runs; absent on a run's first update). The trainer's `step_s` is the whole
update's wall time between two steps.

A second algorithm is a subclass that changes its settings or one part: GRPOLearner is plain GRPO,
the table's "RL without Salvage-DS's pieces": a binary task reward (1 correct, 0 otherwise) in place of
the polarized one, no contrast / competence gate (every group with a valid sample is accepted; a group
whose rewards are all equal gets zero advantages by itself) and no action-only anchor. Everything else
(draw order, G, B, the clipped loss, KL) is the same, so a difference in the table is those pieces.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Any, Sequence

import jax

from rmsweb_jax.data.batching import Buckets
from rmsweb_jax.errors import UserError
from rmsweb_jax.salvage.batches import OLD_LOGPROBS, anchor_row, policy_rows, salvage_batch
from rmsweb_jax.salvage.dynamic_sampling import Draw, DrawSettings, DynamicSampler
from rmsweb_jax.salvage.gates import GateSettings
from rmsweb_jax.salvage.grounding_anchor import GroundingAnchors
from rmsweb_jax.salvage.rewards import RewardSettings, SampleScore, score_samples
from rmsweb_jax.salvage.state_prompts import StatePrompts

REF_LOGPROBS = "token_ref_logprobs"
# The sampling-loop totals a run reports (summary.json "this_run"), summed over its updates' metrics.
TOTALS = ("states_drawn", "groups_accepted", "groups_anchored", "shortfall")


@dataclasses.dataclass(frozen=True)
class LearnerSettings:
    """What an algorithm decides: the reward, the gates, the sampling loop (G, B, budget, anchor mode, seed)
    and the anchor loss weight (0: no anchor rows are built)."""

    reward: RewardSettings
    gates: GateSettings
    draw: DrawSettings
    anchor_weight: float
    epochs: int  # optimizer steps on each drawn batch (config.salvage.epochs)


class SalvageDSLearner:
    """Salvage-DS: polarized (or graded / partial-credit) reward, contrast / competence gates, action-only
    anchor of the rejected groups, all as config.salvage says."""

    algorithm = "salvage_ds"

    @classmethod
    def settings_from_config(cls, salvage) -> LearnerSettings:
        """Returns the settings of the config.salvage block (checked: a bad value fails before a model loads)."""
        epochs = salvage.epochs
        if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1:
            raise UserError(f"config.salvage.epochs = {epochs!r}: expected an int >= 1 (optimizer steps on each drawn "
                            "batch)")
        return LearnerSettings(RewardSettings.from_config(salvage), GateSettings.from_config(salvage),
                               DrawSettings.from_config(salvage), float(salvage.loss.anchor_weight), epochs)

    def __init__(self, actor, rollout, prompts: StatePrompts, settings: LearnerSettings, *, sampling,
                 buckets: Buckets, batch_size: int, pad_id: int, ref_params=None,
                 grounding: GroundingAnchors | None = None):
        self.actor, self.rollout, self.prompts, self.settings = actor, rollout, prompts, settings
        self.sampling, self.buckets, self.batch_size, self.pad_id = sampling, buckets, batch_size, pad_id
        self.ref_params, self.grounding = ref_params, grounding
        self._sync_s: float | None = None  # the last sync's seconds, reported with the next update
        self.sampler = DynamicSampler(len(prompts), self.sample_groups, self.score, settings.draw, settings.gates)
        if actor.data_state is not None:  # a resumed run: the exact sequence of draws continues
            self.sampler.set_state(actor.data_state)

    def describe(self) -> str:
        """Returns the algorithm and its pieces in one line (for the run's log)."""
        s = self.settings
        return (f"{self.algorithm}: G={s.draw.group_size}, B={s.draw.groups_per_step}, budget "
                f"{s.draw.max_draws_per_step} states, reward {self.reward_name()}, gates {s.gates.gates}, "
                f"anchor {s.draw.anchor}" + (f", {s.epochs} optimizer steps per draw" if s.epochs > 1 else "")
                + (f", {self.grounding!r}" if self.grounding is not None else ""))

    def reward_name(self) -> str:
        """Returns the name of the reward the samples are scored with."""
        return self.settings.reward.kind

    # ---- the parts of an update -----------------------------------------------------------------------
    def sample_groups(self, indices: Sequence[int], seed: int) -> list[list[Any]]:
        """Returns G samples of the rollout model for each state of `indices` (one prefill per state)."""
        return self.rollout.sample_groups([self.prompts.context(i)[0] for i in indices],
                                          self.settings.draw.group_size, self.sampling, seed=seed)

    def score(self, index: int, samples: Sequence[Any]) -> list[SampleScore]:
        """Returns each sample's score against state `index`'s reference action."""
        return score_samples([c.text for c in samples], self.prompts.reference_action(index),
                             self.prompts.context(index)[1], self.settings.reward,
                             finish_reasons=[c.finish_reason for c in samples])

    def gate(self) -> Draw:
        """Returns the next update's groups: states drawn, sampled, scored and gated until B are accepted or
        the draw budget is spent (the sampler calls sample_groups and score)."""
        return self.sampler.draw()

    def build_rows(self, draw: Draw) -> tuple[list[dict], list[dict], list[dict]]:
        """Returns (policy rows of the accepted groups, anchor rows of the anchored ones, grounding anchor rows in
        the room the others leave)."""
        prompts = self.prompts
        policy = [row for g in draw.accepted
                  for row in policy_rows(prompts.prompt(g.state_index), g.samples, g.advantages, g.valid)]
        anchors = [] if self.settings.anchor_weight == 0 else [
            anchor_row(prompts.reference(g.state_index), prompts.tokenizer, prompts.name(g.state_index),
                       prompts.image_config.patch_dim)
            for g in draw.anchored]
        grounding = []
        if self.grounding is not None and self.settings.anchor_weight > 0:
            update = self.actor.step_count // self.settings.epochs
            grounding = self.grounding.for_update(update, self.batch_size - len(policy) - len(anchors))
        return policy, anchors, grounding

    def build_batch(self, draw: Draw):
        """Returns (this process's rows of the update's batch, BatchInfo)."""
        policy, anchors, grounding = self.build_rows(draw)
        return salvage_batch(policy, anchors, self.buckets, self.batch_size, pad_id=self.pad_id,
                             feed_index=self.actor.feeds.index, feed_count=self.actor.feeds.count,
                             grounding=grounding)

    def old_logprobs(self, batch: dict) -> None:
        """Fills the batch's old log-probs from the actor's own forward pass over these exact rows (and the
        reference's when there is one)."""
        batch[OLD_LOGPROBS] = self.actor.token_logprobs(batch)
        if self.ref_params is not None:
            batch[REF_LOGPROBS] = self.actor.token_logprobs(batch, params=self.ref_params)

    def update(self, batch: dict, metrics: dict[str, float]) -> None:
        """Takes `epochs` optimizer steps on `batch` (the draw's metrics reported with the first); the sampler's
        state is saved with a checkpoint, which waits for the last of them: a resumed run draws a new batch."""
        epochs = self.settings.epochs
        for epoch in range(epochs):
            self.actor.step(batch, self.sampler.get_state(), host_metrics=metrics if epoch == 0 else None,
                            can_save=epoch == epochs - 1)

    def sync(self) -> None:
        """Refreshes the rollout model from the actor's new parameters (the step donated the old ones)."""
        self.actor.sync_model(self.rollout.model)
        self.rollout.refresh()

    # ---- the loop ---------------------------------------------------------------------------------------
    def train_step(self) -> dict[str, float]:
        """Returns the metrics of one update (one draw): gate, build the batch, old log-probs, update, sync."""
        started = time.perf_counter()
        draw = self.gate()
        drawn = time.perf_counter()
        batch, info = self.build_batch(draw)
        self.old_logprobs(batch)  # host arrays: the forward has finished when it returns
        metrics = {**draw.metrics(), **{f"rows_{k}": v for k, v in info.metrics().items() if k != "length"},
                   "draw_s": drawn - started, "batch_s": time.perf_counter() - drawn}
        if self._sync_s is not None:
            metrics["sync_s"] = self._sync_s
        if self.rollout.resync_seconds is not None:  # the decode copy remade from the last update's weights (a mesh)
            metrics["decode_resync_s"] = self.rollout.resync_seconds
        self.update(batch, metrics)
        synced = time.perf_counter()
        self.sync()
        self._sync_s = time.perf_counter() - synced
        return metrics

    def run(self) -> dict[str, int]:
        """Returns this run's totals (TOTALS), having trained updates until the actor's total_steps."""
        totals = dict.fromkeys(TOTALS, 0)
        while self.actor.step_count < self.actor.settings.total_steps:
            metrics = self.train_step()
            for key in totals:
                totals[key] += int(metrics[key])
        return totals


class GRPOLearner(SalvageDSLearner):
    """Plain GRPO: binary task reward, every group with a valid sample accepted, no anchor (see module)."""

    algorithm = "grpo"

    @classmethod
    def settings_from_config(cls, salvage) -> LearnerSettings:
        """Returns config.salvage's settings without Salvage-DS's pieces: gates "none", anchor "off" (the
        reward kind is checked but replaced by the binary reward; the gate and anchor keys go unused)."""
        base = super().settings_from_config(salvage)
        return dataclasses.replace(base, gates=dataclasses.replace(base.gates, gates="none"),
                                   draw=dataclasses.replace(base.draw, anchor="off"))

    def reward_name(self) -> str:
        return "binary"

    def score(self, index: int, samples: Sequence[Any]) -> list[SampleScore]:
        """Returns each sample's score with the binary task reward: 1.0 correct, 0.0 otherwise."""
        return [dataclasses.replace(s, reward=float(s.correct)) for s in super().score(index, samples)]


LEARNERS = {SalvageDSLearner.algorithm: SalvageDSLearner, GRPOLearner.algorithm: GRPOLearner}


def learner_class(algorithm: str) -> type[SalvageDSLearner]:
    """Returns the learner of config.salvage.algorithm; UserError names the key otherwise."""
    if algorithm not in LEARNERS:
        raise UserError(f"config.salvage.algorithm = {algorithm!r}: expected one of {sorted(LEARNERS)} (salvage_ds: "
                        "the paper's Salvage-DS; grpo: plain GRPO, the ablation without its reward, gates and anchor)")
    return LEARNERS[algorithm]
