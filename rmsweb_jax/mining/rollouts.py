"""On-policy rollouts of the SFT policy, and where each failed one left the reference trajectory.

`run_rollouts` plays the policy once on each training task group (task, seed): one attempt, no
reflection, through the collector every stage uses (collect/retries.py RetryCollector over the
browser pool), into a store of its own, `<workdir>/mine/rollouts/<policy id>/` (the policy id is
the checkpoint's name, sampling/chat_model.py checkpoint_name, so each checkpoint has its own
store and the store refuses any other policy). A rerun resumes: groups already stored are skipped.

`divergences` aligns each FAILED rollout with the reference trajectory of the same task and
seed — its first successful attempt in the reference store (collection stops at a success, so
there is one; an unsolved group has no reference and is skipped) — since MiniWoB++ seeds replay
the same page. The walk pairs the rollout's steps in order with the reference's steps, less those
whose teacher label is in `skip_labels` (a labelled detour is no reference to learn), comparing
each rollout action with the reference's on the reference step's stored observation
(web/semantics.compare_actions). The first reference step the rollout does not match is the
divergence point: a critical state whose context is that REFERENCE step (rebuildable from the
reference store, with the reference action as the target). Its failure mode (mining/taxonomy.py):

- the rollout took another action there: the comparison's category (an unparseable turn is
  invalid_format; an answer where the reference goes on, premature_stop) — except when that
  action is the one the episode then repeated until its end (taxonomy.episode_failure_mode):
  repetition_loop;
- the rollout's episode ended first, every step matched: repetition_loop or out_of_steps from the
  episode's end, or premature_stop when the page ended it early (the time limit, a stray effect).

When `skip_labels` skips "detour" (it names it, or "*"), the rollout's own detours are skipped too: a step whose action
is one the teacher's detours use (NOOP_ACTIONS: wait, hover, scroll) where the reference takes
another action type is passed over, as the SFT policy learnt such steps from the teacher's
labelled ones and nothing the task checks changes. `prefix_matched` then turns False: the
reference step's context is the rollout's state only while every earlier rollout step matched a
reference step; after a skipped rollout step the rollout's history holds a turn the reference
context lacks. (Skipped reference detours do not count against it: their page effects are nil.)
A failed rollout that matched the whole reference and still failed gives no state (there is no
reference action it got wrong); rollouts lost to browser faults or not judged are not failures.
`DivergenceReport.counts` says how many episodes went each way.
"""
from __future__ import annotations

import collections
import dataclasses
import os
import pathlib
import re
from typing import Any, Iterable, Sequence

from rmsweb_jax import storage
from rmsweb_jax.agents.policy import Policy
from rmsweb_jax.collect.records import StepRecord, TrajectoryRecord
from rmsweb_jax.collect.report import check_store_success_rule
from rmsweb_jax.collect.retries import CollectSettings, CollectSummary, RetryCollector
from rmsweb_jax.collect.store import REFLECTION, StoreWriter, TrajectoryStore
from rmsweb_jax.collect.store_layout import STORE_FILE
from rmsweb_jax.collect.store_provenance import policy_provenance
from rmsweb_jax.evaluate import host_shares
from rmsweb_jax.judges.base import ERROR, Judge
from rmsweb_jax.mining.replay import skips_label
from rmsweb_jax.mining.state_set import CriticalState, state_id
from rmsweb_jax.mining.taxonomy import category_failure_mode, episode_failure_mode
from rmsweb_jax.suites.task import Task
from rmsweb_jax.web.semantics import Comparison, compare_actions
from rmsweb_jax.web.suite import Suite

ROLLOUTS_DIR = pathlib.Path("mine", "rollouts")
# What the ScriptedTeacher's detours do (agents/teacher.py): actions that change nothing a task checks.
NOOP_ACTIONS = ("wait", "hover", "scroll")
DETOUR = "detour"
_UNSAFE = re.compile(r"[^A-Za-z0-9._@+-]+")


def policy_id(policy_name: str) -> str:
    """Returns the folder name of a policy's rollout store: the checkpoint name of a "flax:<name>"
    policy (e.g. "hf@0123456789"), any other policy's name; characters unsafe in a file name
    become "_"."""
    name = policy_name.removeprefix("flax:")
    safe = _UNSAFE.sub("_", name).strip("._")
    if not safe:
        raise ValueError(f"policy name {policy_name!r} gives no usable folder name for its rollout store")
    return safe


def rollout_store_dir(workdir: str | os.PathLike, policy_name: str) -> pathlib.Path:
    """Returns `<workdir>/mine/rollouts/<policy id>/`, the rollout store of the policy named `policy_name`."""
    # a gs:// workdir stays one (the store mirrors it)
    return storage.as_path(workdir) / str(ROLLOUTS_DIR) / policy_id(policy_name)


def reference_task_groups(reference_store_dir: str | os.PathLike,
                          keys: Iterable[tuple[str, int]] | None = None) -> list[tuple[Task, int]]:
    """Returns (Task, seed) of every task group of the reference store with a successful attempt
    (those that can have a divergence), in commit order; only those in `keys` when given (e.g.
    the SFT training split). Raises ValueError naming keys the store has no solved group for."""
    wanted = None if keys is None else {(str(t), int(s)) for t, s in keys}
    out = {}
    with TrajectoryStore(reference_store_dir) as store:
        for traj in store.trajectories():
            if traj.success and traj.key not in out and (wanted is None or traj.key in wanted):
                out[traj.key] = (Task.from_dict(traj.task), traj.seed)
    missing = sorted((wanted or set()) - set(out))
    if missing:
        raise ValueError(f"the reference store {reference_store_dir} has no successful attempt for task groups "
                         f"{missing[:5]}{' ...' if len(missing) > 5 else ''} ({len(missing)} of {len(wanted)})")
    return list(out.values())


def run_rollouts(config, workdir: str | os.PathLike, policy: Policy, tasks_and_seeds: Sequence[tuple[Any, int]], *,
                 suite: Suite, judge: Judge) -> tuple[pathlib.Path, CollectSummary]:
    """Returns (the rollout store, the collector's summary) after playing `policy` once (attempts
    = 1, no reflection) on each (task, seed) not yet in its store `<workdir>/mine/rollouts/<policy
    id>/`. The collection settings (workers, max_steps, timeouts, flushes, success rule) are
    config.collect's, as the reference collection had them, and so are the browsers (local, or the remote
    Chromiums config.web.cdp_endpoint names); `suite` and `judge` are built by the
    caller (stages/collect.py make_suite / make_judge).

    On several processes each plays its share of the groups into its own part store and process 0
    merges the parts into the rollout store (evaluate/host_shares.py), so every host returns the same
    store; the summary is this process's."""
    cfg = config.collect
    store_dir = rollout_store_dir(workdir, policy.name)
    target, pairs = host_shares.this_hosts_share(store_dir, tasks_and_seeds)
    if target != store_dir and (store_dir / STORE_FILE).is_file():  # the merged store, which no host opens
        with TrajectoryStore(store_dir) as merged:
            check_store_success_rule(merged.trajectories(), cfg.success, store_dir)
    with StoreWriter(target, flush_every_tasks=cfg.flush_every_tasks, flush_every_s=cfg.flush_every_s,
                     policy=policy.name, provenance=policy_provenance(policy)) as store:
        check_store_success_rule(store.trajectories(), cfg.success, target)
        # The browsers are the collection's: local, or the remote Chromiums of web.cdp_endpoint.
        settings = dataclasses.replace(CollectSettings.from_config(cfg, config.web), attempts=1,
                                       retry_mode=REFLECTION, progress_label="mine")
        collector = RetryCollector(suite, policy, judge, store, settings)
        summary = collector.run_pairs(pairs)
    host_shares.merge_when_played(store_dir, "rollouts")
    return store_dir, summary


@dataclasses.dataclass(frozen=True)
class Divergence:
    """Where one failed rollout left its reference: the critical state (context = the reference
    step), the rollout step there (None when the rollout ended before it) and the comparison."""

    state: CriticalState
    rollout_request_id: str
    rollout_step: int | None
    category: str           # compare_actions category, or "episode_end" when the rollout ran out first
    detail: str
    skipped_rollout_steps: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class DivergenceReport:
    """Every divergence found, and what happened to each rollout episode (`counts`: solved,
    failed, diverged, matched_throughout, no_reference, undecided — lost to faults or not judged)."""

    divergences: tuple[Divergence, ...]
    counts: dict[str, int]

    @property
    def states(self) -> list[CriticalState]:
        """Returns the critical state of each divergence."""
        return [d.state for d in self.divergences]


def divergences(reference_store_dir: str | os.PathLike, rollout_store_dir: str | os.PathLike, *,
                skip_labels: Sequence[str], repetition_window: int) -> list[CriticalState]:
    """Returns the critical state where each failed rollout of `rollout_store_dir` left the reference
    trajectory of its task and seed (see the module docstring); `skip_labels` are config.mine.skip_labels,
    `repetition_window` config.mine.repetition_window."""
    return find_divergences(reference_store_dir, rollout_store_dir, skip_labels=skip_labels,
                            repetition_window=repetition_window).states


def find_divergences(reference_store_dir: str | os.PathLike, rollout_store_dir: str | os.PathLike, *,
                     skip_labels: Sequence[str], repetition_window: int) -> DivergenceReport:
    """Returns every divergence of the failed rollouts and the count of each kind of episode."""
    counts = collections.Counter({k: 0 for k in ("rollouts", "solved", "failed", "diverged", "matched_throughout",
                                                 "no_reference", "undecided")})
    found = []
    with TrajectoryStore(reference_store_dir) as reference, TrajectoryStore(rollout_store_dir) as rollouts:
        solved = {}
        for traj in reference.trajectories():
            if traj.success and traj.key not in solved:  # the first successful attempt
                solved[traj.key] = traj
        for traj in rollouts.trajectories():
            counts["rollouts"] += 1
            if traj.status != "complete" or traj.verdict.outcome == ERROR:
                counts["undecided"] += 1
                continue
            if traj.success:
                counts["solved"] += 1
                continue
            counts["failed"] += 1
            ref = solved.get(traj.key)
            if ref is None:
                counts["no_reference"] += 1
                continue
            divergence = align(reference.steps(ref), rollouts.steps(traj), traj, store_dir=reference.directory,
                               skip_labels=skip_labels, repetition_window=repetition_window)
            if divergence is None:
                counts["matched_throughout"] += 1
            else:
                counts["diverged"] += 1
                found.append(divergence)
    return DivergenceReport(tuple(found), dict(counts))


def align(reference_steps: Sequence[StepRecord], rollout_steps: Sequence[StepRecord], rollout: TrajectoryRecord, *,
          store_dir: str | os.PathLike, skip_labels: Sequence[str], repetition_window: int) -> Divergence | None:
    """Returns where the failed `rollout` (its steps) left the reference trajectory (its steps,
    stored in `store_dir`), or None when it matched every reference step it was compared with and
    ran past them (see the module docstring for the rules)."""
    skip_labels = tuple(skip_labels)
    kept = [s for s in reference_steps if not skips_label(s.label, skip_labels)]
    texts = [s.action_text for s in rollout_steps]
    loop = episode_failure_mode(texts, truncated=rollout.truncated, window=repetition_window)
    matched, skipped, k = True, [], 0
    for step in rollout_steps:
        if k == len(kept):
            return None  # past the reference's end with every step matched: no reference action was missed
        ref = kept[k]
        comparison = _compare(step, ref)
        if comparison.same:
            k += 1
            continue
        if skips_label(DETOUR, skip_labels) and step.action.name in NOOP_ACTIONS and comparison.category == "wrong_action_type":
            matched = False  # the rollout's own detour: its history now holds a turn the reference's lacks
            skipped.append(step.step)
            continue
        mode = category_failure_mode(comparison.category)
        if loop == "repetition_loop" and step.action_text.strip() == texts[-1].strip():
            mode = "repetition_loop"  # it took the action it then repeated until the end
        return _divergence(ref, rollout, step.step, comparison.category, comparison.detail, mode, matched, skipped,
                           store_dir)
    if k == len(kept):
        return None
    # The episode ended before the reference did, every compared step matched (detours aside).
    mode = loop or "premature_stop"
    detail = (f"the rollout ended after {len(rollout_steps)} steps ({rollout.end_reason or 'no reason given'}); "
              f"the reference goes on with step {kept[k].step}")
    return _divergence(kept[k], rollout, None, "episode_end", detail, mode, matched, skipped, store_dir)


def _compare(step: StepRecord, ref: StepRecord) -> Comparison:
    if step.parse_error is not None:  # the executed `wait` was the collector's stand-in, not the policy's
        return Comparison(False, "unparseable", f"unparseable turn ({step.parse_error})")
    return compare_actions(step.action, ref.action, ref.observation())


def _divergence(ref: StepRecord, rollout: TrajectoryRecord, rollout_step: int | None, category: str, detail: str,
                mode: str, matched: bool, skipped: list[int], store_dir) -> Divergence:
    state = CriticalState(
        state_id=state_id("rollout", ref.request_id, ref.step), task_id=ref.task_id, seed=ref.seed,
        attempt=ref.attempt, step=ref.step, request_id=ref.request_id, store_dir=str(store_dir),
        reference_text=ref.text, reference_action=ref.action, failure_mode=mode, critical=True,
        replay_accuracy=None, reference_logprob=None, source="rollout", prefix_matched=matched,
        teacher_label=ref.label)
    return Divergence(state, rollout.request_id, rollout_step, category, detail, tuple(skipped))
