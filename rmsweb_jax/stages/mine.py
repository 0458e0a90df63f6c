"""The `mine` stage: the SFT policy's critical states on the sft training split, as an RL state set.

    python -m rmsweb_jax.main --config=configs/demo.py --config.stages=mine --workdir=/tmp/run

The policy is config.mine.checkpoint (default hf:<workdir>/sft/hf, the sft export). The reference
steps are the successful steps of the task groups sft TRAINED on, read from the
<workdir>/sft/split.json it wrote (never recomputed): held-out groups stay out of RL, so the
held-out evaluation keeps meaning what it says. Every reference step is replayed (mining/replay.py:
K samples, accuracy, failure mode, reference log-prob; a teacher-labelled step is no reference), or
with config.mine.max_states a seeded draw of that many, stratified over tasks (mining/draw.py: the
store holds the steps task by task, so a prefix would be the first task's); with
config.mine.rollouts the policy also plays each training task group once in the browser and
each failed episode's divergence from its reference becomes a critical state (mining/rollouts.py).
The state set keeps every critical state and a draw of routine ones, config.mine.routine_share of
the set (the seed of config.mine.seed), so RL can also see states the policy already gets right.
With config.mine.uniform_states = n > 0 the set is instead a seeded draw of n of all the training split's steps
(stratified over tasks; config.mine.max_states does not cap it), replayed for their labels and kept, critical or
not: no mining (the table's rl_all_states ablation, at the main state set's size). A draw from the capped replay
instead is about the mined set itself (in the demo it was the very same 189 states: mining kept 189 of 200, the SFT
policy failing 80% of its replayed steps), and the ablation could not test mining.

Writes <workdir>/mine/{states.arrayrecord, report.json, report.md, failure_modes.png, summary.json}. While it
replays, <workdir>/mine/replay/ holds the batches done (mining/replay_journal.py): a run stopped by SIGTERM, Ctrl-C
or a crash reruns only the batches it had not finished.
"""
from __future__ import annotations

import collections
import dataclasses
import hashlib
import json
import pathlib

import jax
import numpy as np

from rmsweb_jax import storage
from rmsweb_jax.agents.flax_policy import FlaxPolicy
from rmsweb_jax.agents.prompt import PromptBuilder, prompt_config_from
from rmsweb_jax.errors import UserError
from rmsweb_jax.judges.from_config import judge_from_config
from rmsweb_jax.mining import rollouts
from rmsweb_jax.mining.draw import stratified_sample
from rmsweb_jax.mining.replay import ReplayedState, ReplaySettings, replay, skips_label
from rmsweb_jax.mining.replay_journal import ReplayJournal
from rmsweb_jax.mining.report import compute_report, write_report
from rmsweb_jax.mining.state_set import CriticalState, state_id, write_state_set
from rmsweb_jax.models.from_config import host_copy_config
from rmsweb_jax.sampling.chat_model import ChatModel
from rmsweb_jax.sampling.sampler import SamplingParams
from rmsweb_jax.stages import links
from rmsweb_jax.stages.manifest import COLLECT_RUNTIME, MODEL_LOADING
from rmsweb_jax.stages.sft_split import saved_split
from rmsweb_jax.suites.from_config import suite_from_config

# What the stage reads and writes (rmsweb_jax/stages/manifest.py decides from these whether it is up to date).
# sft's split.json always (whatever mine.checkpoint names); config.collect and config.web for the rollouts'
# browsers and judge.
CONFIG_READS = ("mine", "data", "prompt", "collect", "web", *MODEL_LOADING, "seed")
INPUT_STAGES = {"sft": None}
OUTPUTS = {"mine/states.arrayrecord": None, "mine/summary.json": None, "mine/report.json": None}
FRESH_START = ("mine",)  # a rerun for a change starts afresh (manifest.py)
NON_RESULT_FIELDS = COLLECT_RUNTIME  # ... but not for a change of these alone

NAME = "mine"
STATES_FILE = "states.arrayrecord"
JOURNAL = "replay"  # the replay so far, a batch at a time: a stopped run's rerun replays only the rest


def replay_state(replayed: ReplayedState, example, store_dir: str) -> CriticalState:
    """Returns the CriticalState of one replayed reference step (its example from the SFT view)."""
    return CriticalState(
        state_id=state_id("replay", example.request_id, example.step.step), task_id=example.task_id,
        seed=example.seed, attempt=example.attempt, step=example.step.step, request_id=example.request_id,
        store_dir=store_dir, reference_text=example.target_text, reference_action=example.step.action,
        failure_mode=replayed.failure_mode, critical=replayed.critical, replay_accuracy=replayed.accuracy,
        reference_logprob=replayed.reference_logprob, source="replay", prefix_matched=None,
        teacher_label=example.step.label)


def merge_rollout_states(replayed: list[CriticalState], rollout: list[CriticalState]) -> list[CriticalState]:
    """Returns one state per reference step: the replay states, each replaced by the rollout divergence at
    the same step when there is one (which takes the replayed accuracy and reference log-prob). The
    policy went wrong there on its own trajectory, so the step is critical whatever the replay
    accuracy; keeping both would make RL draw the step twice as often as the others."""
    at = {(s.request_id, s.step): s for s in rollout}
    merged = []
    for state in replayed:
        found = at.pop((state.request_id, state.step), None)
        merged.append(state if found is None else dataclasses.replace(
            found, replay_accuracy=state.replay_accuracy, reference_logprob=state.reference_logprob))
    return merged + [s for s in rollout if (s.request_id, s.step) in at]


def select_states(states: list[CriticalState], routine_share: float, seed: int) -> list[CriticalState]:
    """Returns every critical state and a seeded draw of routine ones making `routine_share` of the
    result (fewer when there are not enough), in the input order."""
    critical = [i for i, s in enumerate(states) if s.critical]
    routine = [i for i, s in enumerate(states) if not s.critical]
    want = int(round(len(critical) * routine_share / (1.0 - routine_share))) if critical else 0
    if not critical and routine_share > 0:
        want = len(routine)  # nothing critical: the set is all routine (RL then has nothing to fix; the report says so)
    want = min(want, len(routine))
    keep = set(critical) | set(np.random.default_rng(seed).choice(routine, size=want, replace=False).tolist()
                               if want else ())
    return [s for i, s in enumerate(states) if i in keep]


def replay_indices(view, train, max_states: int, seed: int) -> list[int]:
    """Returns the SFT view indices to replay: every one of `train`, or (max_states > 0) a seeded draw of that
    many stratified over tasks. A draw, not a prefix: the store holds the steps task by task (mining/draw.py)."""
    if max_states <= 0:
        return [int(i) for i in train]
    return [int(i) for i in stratified_sample(train, lambda i: view.task_key(i)[0], max_states, seed)]


def state_indices(view, train, max_states: int, uniform: int, seed: int, skip_labels=()) -> list[int]:
    """Returns the SFT view indices the stage replays: replay_indices' (every training step or a capped draw), or,
    uniform = n > 0, a seeded draw of n of `train`'s steps that are references (no label `skip_labels` skips),
    stratified over tasks, from a seed of its own (seed + 1) so that it is not the capped replay's draw; every one
    becomes a state. UserError when n exceeds those steps."""
    if uniform <= 0:
        return replay_indices(view, train, max_states, seed)
    references = [int(i) for i in train if not skips_label(view[int(i)].step.label, skip_labels)]
    if uniform > len(references):
        raise UserError(f"config.mine.uniform_states = {uniform}, but the training split holds {len(references)} "
                        "reference steps (labelled teacher steps are none): lower it")
    return replay_indices(view, references, uniform, seed + 1)


def uniform_states(states: list[CriticalState], n: int, seed: int) -> list[CriticalState]:
    """Returns a seeded uniform draw of `n` of `states`, critical or not (no mining), in the input order."""
    if not 0 <= n <= len(states):
        raise ValueError(f"a uniform draw of {n} states from {len(states)}")
    keep = set(np.random.default_rng(seed).choice(len(states), size=n, replace=False).tolist())
    return [s for i, s in enumerate(states) if i in keep]


def _checkpoint(cfg, workdir: pathlib.Path) -> str:
    spec = cfg.checkpoint or f"hf:{links.folder(workdir, 'sft') / 'hf'}"
    if spec.startswith("hf:") and not (storage.user_path(spec[3:]) / "config.json").is_file():
        raise UserError(f"config.mine.checkpoint {spec!r}: no HF checkpoint there (run the sft stage with "
                        "config.train.export_hf=True first, or point it at hf:/path)")
    return spec


def _checkpoint_files(spec: str) -> dict:
    """Returns {file: [bytes, modification time]} of an hf: checkpoint's folder ({} for another spec): a journal of
    another export of the same path (sft reran while mine was stopped) is not this replay's."""
    if not spec.startswith("hf:"):
        return {}
    folder = storage.user_path(spec[3:])
    found = storage.remote_versions(folder) if storage.is_remote(folder) else storage.local_versions(folder)
    return {name: list(version) for name, version in sorted(found.items())}


def _rollout_states(config, workdir: pathlib.Path, chat_model, builder, store_dir: str, train_keys,
                    settings: ReplaySettings, spec: str) -> tuple[list[CriticalState], dict]:
    """Plays the policy once on each training task group and returns the divergence states and the counts.

    On several processes each host plays its share of the groups (mining/rollouts.py) with its own copy of
    the checkpoint `spec` on its own devices (in the compute dtype, on the mesh models/from_config.py fits to
    a host; the planner counts it): its browsers ask for steps at their own pace, so the replay's model on the
    global mesh (whose programs every host must call in lockstep) cannot serve them; the caller has closed it."""
    cfg = config.collect
    tasks = rollouts.reference_task_groups(store_dir, train_keys)
    # The rollout decodes as collection does (config.collect's temperature and token limit).
    hosts = jax.process_count()
    if hosts > 1:
        chat_model = ChatModel.load(spec, workdir, config=host_copy_config(config),
                                    max_batch=int(config.mine.max_batch), devices=jax.local_devices())
    policy = FlaxPolicy(chat_model, builder, SamplingParams(max_new_tokens=cfg.max_new_tokens,
                                                            temperature=cfg.temperature), seed=config.seed,
                        owns_model=hosts > 1)
    try:
        with suite_from_config(cfg) as suite:
            rollout_dir, _ = rollouts.run_rollouts(config, workdir, policy, tasks, suite=suite,
                                                   judge=judge_from_config(cfg))
    finally:
        if hosts > 1:
            policy.close()  # this host's copy; the caller closes the replay's model
    found = rollouts.find_divergences(store_dir, rollout_dir, skip_labels=settings.skip_labels,
                                      repetition_window=int(config.mine.repetition_window))
    # In task order, not the merged store's (which follows how the hosts shared the groups): the same state set,
    # and so the same Salvage-DS draws, on any number of hosts.
    states = sorted(found.states, key=lambda s: (s.task_id, s.seed, s.step))
    return states, {"store": str(rollout_dir), **found.counts}


def check_config(config, workdir) -> ReplaySettings:
    """Returns the replay's settings of config.mine once its state-set fields check too (no split, store or model
    read); raises UserError naming the key. The pipeline calls it before any stage runs (stages/pipeline.py
    check_stages), run() as its first step."""
    cfg = config.mine
    try:
        settings = ReplaySettings.from_config(cfg)
    except ValueError as err:
        raise UserError(str(err)) from None
    if not 0.0 <= cfg.routine_share < 1.0:
        raise UserError(f"config.mine.routine_share must be in [0, 1) (the share of routine states in the state "
                        f"set), got {cfg.routine_share}")
    if cfg.max_states < 0:
        raise UserError(f"config.mine.max_states must be >= 0 (0 = every training step), got {cfg.max_states}")
    if cfg.uniform_states < 0:
        raise UserError(f"config.mine.uniform_states must be >= 0 (0 = the mined state set), got {cfg.uniform_states}")
    return settings


def run(config, workdir: pathlib.Path) -> dict:
    """Mines the training split's reference steps; writes the state set, the report and summary.json."""
    cfg = config.mine
    settings = check_config(config, workdir)
    workdir = storage.as_path(workdir)  # local, or gs://
    # Every host replays the same states (the same sampling programs, on the global mesh); one writes.
    writer = jax.process_index() == 0
    data, view, split, split_file = saved_split(config, workdir)
    indices = state_indices(view, split.train, int(cfg.max_states), int(cfg.uniform_states), int(cfg.seed),
                            settings.skip_labels)
    if not len(indices):
        raise UserError(f"{split_file} leaves no training steps of {data.store_dir} to mine (every task group is "
                        "held out): lower config.data.held_out_fraction and rerun sft")
    spec = _checkpoint(cfg, workdir)
    # The states name their store: absolute when local, as given on a bucket.
    store_dir = data.store_dir if storage.is_remote(data.store_dir) else str(pathlib.Path(data.store_dir).resolve())
    train_keys = sorted({view.task_key(i) for i in split.train})
    out = workdir / NAME
    chat_model = ChatModel.load(spec, workdir, config=config, max_batch=cfg.max_batch)
    builder = PromptBuilder(prompt_config_from(config))
    rollout_counts = None
    try:
        print(f"[mine] {spec}: replaying {len(indices)} reference steps of {len(train_keys)} training task groups "
              f"(K={settings.samples}, temperature {settings.temperature:g}, tau {settings.tau:g})")
        journal = ReplayJournal(out / JOURNAL, writer=writer, key={
            "checkpoint": spec, "checkpoint_files": _checkpoint_files(spec), "store_dir": store_dir,
            "settings": dataclasses.asdict(settings),
            "steps": hashlib.blake2b(np.asarray(indices, np.int64).tobytes(), digest_size=16).hexdigest()})
        result = replay(view, indices, chat_model, builder, settings, journal=journal)
        if result.resumed:
            print(f"[mine] resumed: {result.resumed} states from {out / JOURNAL} (a stopped run's), "
                  f"{len(result.states) - result.resumed} replayed now")
        states = [replay_state(s, view[s.index], store_dir) for s in result.states]
        if cfg.rollouts:
            if jax.process_count() > 1:  # never two models at once: each host loads its own copy next
                chat_model.close()
            rollout, rollout_counts = _rollout_states(config, workdir, chat_model, builder, store_dir, train_keys,
                                                      settings, spec)
            states = merge_rollout_states(states, rollout)
    finally:
        chat_model.close()
    if cfg.uniform_states > 0:  # the replayed draw itself (a draw of n of them when rollout states were merged in)
        chosen = uniform_states(states, min(int(cfg.uniform_states), len(states)), int(cfg.seed))
    else:
        chosen = select_states(states, float(cfg.routine_share), int(cfg.seed))
    path = write_state_set(out / STATES_FILE, chosen) if writer else out / STATES_FILE
    state_set = {"path": str(path), "states": len(chosen), "critical": sum(s.critical for s in chosen),
                 "routine": sum(not s.critical for s in chosen), "routine_share": float(cfg.routine_share),
                 "selection": "uniform" if cfg.uniform_states > 0 else "mined",
                 "by_task": dict(sorted(collections.Counter(s.task_id for s in chosen).items()))}
    extra = {"checkpoint": spec, "store_dir": store_dir, "split": str(split_file), "samples": settings.samples,
             "temperature": settings.temperature, "skipped": result.skipped, "throughput": result.throughput,
             "state_set": state_set, "rollouts": rollout_counts}
    report = compute_report(states, tau=settings.tau, extra=extra)
    if not writer:
        return {k: report[k] for k in ("states", "critical", "routine", "critical_share", "failure_modes")}
    paths = write_report(out, report)
    summary = {k: report[k] for k in ("states", "critical", "routine", "critical_share", "failure_modes",
                                      "teacher_noise", "throughput", "state_set", "skipped", "rollouts")}
    summary["report"] = {k: str(v) for k, v in paths.items()}
    storage.write_text_atomic(out / "summary.json", json.dumps(summary, indent=2))
    storage.remove_tree(out / JOURNAL)  # the state set holds what it kept
    modes = ", ".join(f"{m} {n}" for m, n in report["failure_modes"].items() if n) or "none"
    rate, after = result.throughput["states_per_s"], result.throughput["states_per_s_after_first_batch"]
    print(f"[mine] {report['critical']}/{report['states']} states critical ({modes}); teacher noise "
          f"{report['teacher_noise']['critical_with_label']}; {rate:.3f} states/s"
          + ("" if after is None else f", {after:.3f} after the first batch (compiles)")
          + f" ({100 * result.throughput['sampling_share']:.0f}% sampling); state set {path} "
          f"({state_set['critical']} critical + {state_set['routine']} routine); report {paths['markdown']}")
    return summary
