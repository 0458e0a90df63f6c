"""Replay mining: how often the SFT policy, put back in each reference state, takes the reference action.

For every step of the reference (successful) trajectories — SFTView items, less the steps whose
teacher label `skip_labels` names (by default "*", every labelled step: the teacher's injected
mistakes are no reference to learn, and a solved trajectory can hold a wrong_element step that
Salvage-DS would otherwise reward repeating) — the policy prompt
is rebuilt exactly as SFT trains on it and sampling serves it (agents/prompt.py PromptBuilder on
the example's reflection-free StepContext), K turns are sampled at the mining temperature, and
each is parsed and compared with the stored action by `web.semantics.compare_actions` on the
stored observation; a turn cut by the token limit is wrong (`action_text.parse_turn`, the rule the
Salvage-DS rewards use too). The state's accuracy is the share of samples that are the same action; it is
critical when the accuracy is below tau, and its failure mode is then the most frequent mode
among its wrong samples (mining/taxonomy.py). Optionally the cheaper signal
log p(reference tool call | prompt, reference thought) comes from one forward pass over
prompt + reference turn (train/logprobs.py on the action-only loss mask of encode_for_training:
the `<tool_call>...</tool_call>` tokens and the closing `<|im_end|>`).

Sampling, scoring and log-probs are timed separately; `ReplayResult.throughput` reports states/s
and each part's share of the wall time, and the states/s after the first batch: the first carries the
compiles of the sampler's and the log-prob programs (about 6 s on 2 CPU cores for the demo model, as long as
~90 states after it), so a short replay's overall rate says little about a long one's.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Callable, Sequence

import jax
import numpy as np
from jax.experimental import multihost_utils
from tqdm import tqdm

from rmsweb_jax.agents.prompt import PromptBuilder
from rmsweb_jax.collect.sft_view import SFTExample
from rmsweb_jax.data.batching import assemble
from rmsweb_jax.data.sft import encode_example, example_name
from rmsweb_jax.errors import UserError
from rmsweb_jax.mining.replay_journal import ReplayJournal
from rmsweb_jax.mining.taxonomy import ROUTINE, majority_failure_mode, sample_failure_mode
from rmsweb_jax.models.sharding import DEFAULT_RULES
from rmsweb_jax.sampling.sampler import SamplingParams, rollout_params
from rmsweb_jax.train import batch as batch_lib
from rmsweb_jax.train.global_images import row_owners
from rmsweb_jax.train.image_batch import round_up
from rmsweb_jax.train.logprobs import logprob_fn, sequence_logprobs
from rmsweb_jax.train.step import ModelParts
from rmsweb_jax.web.action_text import parse_turn
from rmsweb_jax.web.semantics import compare_actions

# Log-prob rows are padded to a multiple of this many tokens (and patch rows to LOGPROB_PATCH_QUANTUM)
# so that a mining run compiles the forward pass for a few shapes, not one per chunk.
LOGPROB_LENGTH_QUANTUM = 512
LOGPROB_PATCH_QUANTUM = 1024
ANY_LABEL = "*"  # in config.mine.skip_labels: every teacher-labelled step


def skips_label(label: str | None, skip_labels: Sequence[str]) -> bool:
    """Returns whether a step with teacher label `label` (None: unlabelled) is no reference under `skip_labels`."""
    return label is not None and (ANY_LABEL in skip_labels or label in skip_labels)


@dataclasses.dataclass(frozen=True)
class ReplaySettings:
    """config.mine's replay settings, validated (configs/common.py holds the defaults)."""

    samples: int
    temperature: float
    top_p: float
    max_new_tokens: int
    tau: float
    batch_states: int
    seed: int
    reference_logprob: bool
    skip_labels: tuple[str, ...]

    def __post_init__(self):
        if self.samples < 1:
            raise UserError(f"config.mine.samples must be >= 1 (K samples per state), got {self.samples}")
        if self.temperature <= 0:
            raise UserError(f"config.mine.temperature must be > 0 (K greedy samples would all be one), "
                            f"got {self.temperature}")
        if not 0 < self.tau <= 1:
            raise UserError(f"config.mine.tau must be in (0, 1] (critical: accuracy < tau), got {self.tau}")
        if self.batch_states < 1:
            raise UserError(f"config.mine.batch_states must be >= 1, got {self.batch_states}")
        if self.max_new_tokens < 1:
            raise UserError(f"config.mine.max_new_tokens must be >= 1, got {self.max_new_tokens}")

    @classmethod
    def from_config(cls, mine) -> "ReplaySettings":
        """Returns the settings of config.mine (skip_labels: comma-separated labels, or "*" for every label)."""
        labels = tuple(s.strip() for s in str(mine.skip_labels).split(",") if s.strip())
        return cls(samples=int(mine.samples), temperature=float(mine.temperature), top_p=float(mine.top_p),
                   max_new_tokens=int(mine.max_new_tokens), tau=float(mine.tau), batch_states=int(mine.batch_states),
                   seed=int(mine.seed), reference_logprob=bool(mine.reference_logprob), skip_labels=labels)


@dataclasses.dataclass(frozen=True)
class ReplayedState:
    """What replay found at one reference step: accuracy over K samples, failure mode, log-prob."""

    index: int                      # the example's index in the SFTView
    name: str                       # "<request id>/<step>"
    task_id: str
    seed: int
    accuracy: float
    failure_mode: str               # a TAXONOMY name, or "routine"
    mode_counts: dict[str, int]     # failure mode -> wrong samples of that mode
    reference_logprob: float | None
    teacher_label: str | None
    samples: tuple[str, ...]        # the sampled turns (for the report's examples)

    @property
    def critical(self) -> bool:
        """Returns whether the state is critical (its failure mode is not routine)."""
        return self.failure_mode != ROUTINE


@dataclasses.dataclass(frozen=True)
class ReplayResult:
    """Every replayed state, the steps skipped by label, and where the time went."""

    states: tuple[ReplayedState, ...]
    skipped: dict[str, int]         # teacher label -> reference steps skipped
    seconds: dict[str, float]       # sampling, scoring, logprob, total
    first_batch: tuple[int, float]  # (states, seconds) of the first batch, its programs' compiles included
    resumed: int = 0                # states a stopped run had replayed (its journal), not timed here

    @property
    def throughput(self) -> dict[str, float]:
        """Returns states/s, the share of the wall time spent sampling, scoring and on log-probs, and states/s after
        the first batch (None when it was the only one), of the states this run replayed."""
        total = max(self.seconds["total"], 1e-9)
        first_states, first_seconds = self.first_batch
        replayed = len(self.states) - self.resumed
        after = replayed - first_states
        return {"states": len(self.states), "samples": sum(len(s.samples) for s in self.states),
                "resumed_states": self.resumed,
                "states_per_s": replayed / total, "seconds": round(self.seconds["total"], 3),
                **{f"{k}_share": self.seconds[k] / total for k in ("sampling", "scoring", "logprob")},
                "first_batch_states": first_states, "first_batch_seconds": round(first_seconds, 3),
                "states_per_s_after_first_batch": after / max(total - first_seconds, 1e-9) if after else None}


def score_samples(turns: Sequence[tuple[str, str]], example: SFTExample) -> list[str | None]:
    """Returns the failure mode of each sampled turn (text, finish reason) against the example's stored action
    (None: the same action), read by `parse_turn` in the stored observation's coordinate space and compared
    on it: a turn cut by the token limit is invalid_format, as the Salvage-DS rewards score it -1."""
    observation = example.step.observation()
    modes = []
    for text, finish_reason in turns:
        parsed = parse_turn(text, finish_reason, observation.coordinate_space)
        outcome = parsed if not parsed.ok else compare_actions(parsed, example.step.action, observation)
        modes.append(sample_failure_mode(outcome))
    return modes


def classify(modes: Sequence[str | None], tau: float) -> tuple[float, str]:
    """Returns (accuracy, failure mode) of a state from its samples' failure modes (None = right):
    critical with the most frequent wrong mode when accuracy < tau, else "routine"."""
    if not modes:
        raise ValueError("a state needs at least one scored sample")
    accuracy = sum(m is None for m in modes) / len(modes)
    if accuracy >= tau:
        return accuracy, ROUTINE
    return accuracy, majority_failure_mode(modes)


def sample_turns(chat_model, conversations: Sequence[list[dict]], k: int, params, seed: int
                 ) -> list[list[tuple[str, str]]]:
    """Returns K sampled assistant turns (text, finish reason) per conversation (the only place replay calls the
    sampler):
    each prompt is prefilled once and its K samples decode from copies of its KV cache. `params` are drawn as
    Salvage-DS's rollouts draw (sampler.rollout_params: the vision placeholders never drawn): mining measures the
    policy RL samples."""
    params = rollout_params(chat_model.model.config, params.max_new_tokens, params.temperature, params.top_p)
    groups = chat_model.sample_groups(conversations, k, params, seed=seed)
    return [[(c.text, c.finish_reason) for c in group] for group in groups]


class ReferenceLogprobs:
    """log p(reference tool call + end of turn | prompt, reference thought) of examples, one forward pass
    per chunk through train/logprobs.py (the forward is jitted once, then reused for every chunk)."""

    def __init__(self, chat_model, builder: PromptBuilder):
        self.chat_model, self.builder = chat_model, builder
        self.parts = ModelParts.split(chat_model.model)
        self._fn = jax.jit(logprob_fn(self.parts))

    def __call__(self, examples: Sequence[SFTExample]) -> list[float]:
        """Returns the reference action's log-prob of each example."""
        model = self.chat_model
        image_config = model.image_config
        encoded = [encode_example(model.tokenizer, self.builder, image_config, ex, mask="action_only")
                   for ex in examples]
        length = round_up(max(len(e["input_ids"]) for e in encoded), LOGPROB_LENGTH_QUANTUM)
        patches = round_up(max(sum(len(e["pixel_values"]) for e in encoded), 1), LOGPROB_PATCH_QUANTUM)
        if len(jax.tree.leaves(self.parts.params)[0].sharding.device_set) > 1:
            # A mesh (over one or several processes): rows split over its batch axes, not replicated on every device.
            return self._over_processes(encoded, length, patches)
        host = assemble([[e] for e in encoded], length, patches, image_config.patch_dim, pad_id=model.pad_id)
        batch = batch_lib.prepare_batch(host, model.model.config, 1, vision_window=model.model.runtime.vision_window)
        logps = sequence_logprobs(self._fn(self.parts.params, batch), batch.weights)
        return [float(x) for x in np.asarray(logps)[0]]

    def _over_processes(self, encoded: list[dict], length: int, patches: int) -> list[float]:
        """Returns the log-probs of `encoded` (the same rows on every process) from one forward pass on the
        global mesh: each feed (train/feeds.py) places its block of the rows (padded to a whole number of rows
        per row shard it holds), and the per-row results are gathered back into `encoded`'s order."""
        model = self.chat_model
        mesh = jax.tree.leaves(self.parts.params)[0].sharding.mesh  # the mesh the model was loaded on
        layout = batch_lib.batch_feeds(mesh, DEFAULT_RULES)
        shards = batch_lib.data_parallel_size(mesh) // layout.count  # row shards of one feed
        local = round_up(-(-len(encoded) // layout.count), shards)
        mine = encoded[layout.index * local:(layout.index + 1) * local]
        host = assemble([[e] for e in mine] + [[]] * (local - len(mine)), length, patches,
                        model.image_config.patch_dim, pad_id=model.pad_id)
        batch = batch_lib.prepare_batch(host, model.model.config, 1, rows=local, mesh=mesh, rules=DEFAULT_RULES,
                                        vision_window=model.model.runtime.vision_window)
        placed = batch_lib.to_global(batch, batch_lib.batch_shardings(batch, mesh, DEFAULT_RULES))
        logps = np.asarray(multihost_utils.process_allgather(
            sequence_logprobs(self._fn(self.parts.params, placed), placed.weights), tiled=True))[0]
        shape = (1, local * layout.count, length)
        owners = row_owners(batch_lib.row_sharding(mesh, DEFAULT_RULES, shape, 1), shape)
        at = {(layout.of_process(int(p)), int(r)): g for g, (p, r) in enumerate(owners)}
        return [float(logps[at[(j // local, j % local)]]) for j in range(len(encoded))]


def replay(view, indices: Sequence[int], chat_model, builder: PromptBuilder, settings: ReplaySettings, *,
           progress: bool = True, sample: Callable = sample_turns, journal: ReplayJournal | None = None
           ) -> ReplayResult:
    """Returns the replay of every example `indices` of `view` (an SFTView) whose teacher label is not in
    settings.skip_labels: K samples each from `chat_model`, scored, classified by settings.tau. With a journal,
    the batches it holds are taken from it (the same as replaying them) and each new batch is added to it."""
    done = _agreed_batches(journal.done()) if journal is not None else []
    params = SamplingParams(max_new_tokens=settings.max_new_tokens, temperature=settings.temperature,
                            top_p=settings.top_p)
    logprobs = ReferenceLogprobs(chat_model, builder) if settings.reference_logprob else None
    seconds = {"sampling": 0.0, "scoring": 0.0, "logprob": 0.0}
    skipped: dict[str, int] = {}
    states: list[ReplayedState] = []
    resumed = sum(len(batch) for batch in done if batch is not None)
    position = 0  # batches begun
    first_batch = (0, 0.0)
    start = time.perf_counter()

    def run_chunk(chunk: list[tuple[int, SFTExample]]) -> None:
        nonlocal first_batch, position
        position += 1
        if position <= len(done):
            rows = done[position - 1] or ()  # None: process 0's, not visible on this host
            states.extend(ReplayedState(**{**row, "samples": tuple(row["samples"])}) for row in rows)
            bar.update(len(chunk))
            return
        t0 = time.perf_counter()
        turns = sample(chat_model, [builder.messages(ex.context()) for _, ex in chunk], settings.samples, params,
                       settings.seed + position - 1)  # a batch's seed is its position: a resumed replay is the same
        t1 = time.perf_counter()
        scored = [score_samples(texts, ex) for (_, ex), texts in zip(chunk, turns)]
        t2 = time.perf_counter()
        ref = logprobs([ex for _, ex in chunk]) if logprobs is not None else [None] * len(chunk)
        seconds["sampling"] += t1 - t0
        seconds["scoring"] += t2 - t1
        seconds["logprob"] += time.perf_counter() - t2
        if len(states) == resumed:  # this run's first batch: from its start (its examples' reading included)
            first_batch = (len(chunk), time.perf_counter() - start)
        for (i, ex), texts, modes, lp in zip(chunk, turns, scored, ref):
            accuracy, mode = classify(modes, settings.tau)
            counts: dict[str, int] = {}
            for m in modes:
                if m is not None:
                    counts[m] = counts.get(m, 0) + 1
            states.append(ReplayedState(
                index=i, name=example_name(ex), task_id=ex.task_id, seed=ex.seed, accuracy=accuracy,
                failure_mode=mode, mode_counts=counts, reference_logprob=lp, teacher_label=ex.step.label,
                samples=tuple(text for text, _ in texts)))
        if journal is not None:
            journal.add(position - 1, states[-len(chunk):])
        bar.update(len(chunk))
        bar.set_postfix({"critical": f"{sum(s.critical for s in states)}/{len(states)}",
                         "states/s": f"{(len(states) - resumed) / (time.perf_counter() - start):.2f}"}, refresh=False)

    # Examples are read as they are needed (each holds its screenshots), a chunk of batch_states at a time.
    bar = tqdm(total=len(indices), desc="mine replay", unit="state", dynamic_ncols=True, disable=not progress)
    try:
        chunk: list[tuple[int, SFTExample]] = []
        for i in indices:
            example = view[int(i)]
            label = example.step.label
            if skips_label(label, settings.skip_labels):
                skipped[label] = skipped.get(label, 0) + 1
                bar.update(1)
                continue
            chunk.append((int(i), example))
            if len(chunk) == settings.batch_states:
                run_chunk(chunk)
                chunk = []
        if chunk:
            run_chunk(chunk)
    finally:
        bar.close()
    seconds["total"] = time.perf_counter() - start
    return ReplayResult(states=tuple(states), skipped=skipped, seconds=seconds, first_batch=first_batch,
                        resumed=resumed)


def _agreed_batches(batches: list) -> list:
    """Returns the journal's batches, as many as process 0 holds on every process of a pod slice (they replay the
    same batches together; a host that cannot see the workdir's journal replays what process 0 resumes)."""
    if jax.process_count() == 1:
        return batches
    count = int(multihost_utils.broadcast_one_to_all(np.int32(len(batches))))
    return batches[:count] if len(batches) >= count else batches + [None] * (count - len(batches))
