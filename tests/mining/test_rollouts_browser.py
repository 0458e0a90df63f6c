"""Rollouts through the collector on MiniWoB++ in real Chromium, and their divergences found where
they are known: the reference store is the ScriptedTeacher with detours only (labelled), the
"SFT policy" is the teacher with wrong elements and early stops (no detours). Same task and seed,
same page, same plan: a failed rollout leaves the reference exactly at its first injected mistake.
(The teacher is a scripted stand-in for an LLM collector; its rates are no result.)"""
import pytest

from configs.common import base_config
from rmsweb_jax.agents.teacher import MistakeConfig, ScriptedTeacher
from rmsweb_jax.collect.retries import RetryCollector
from rmsweb_jax.collect.store import StoreError, TrajectoryStore
from rmsweb_jax.judges.programmatic import ProgrammaticJudge
from rmsweb_jax.mining.rollouts import find_divergences, reference_task_groups, rollout_store_dir, run_rollouts
from rmsweb_jax.suites.miniwob import MiniWoBSuite, load_miniwob_tasks
from tests.settings import collect_settings, store_writer

pytestmark = [pytest.mark.browser, pytest.mark.slow]

TASKS = ("miniwob.click-button-sequence", "miniwob.click-checkboxes", "miniwob.click-option",
         "miniwob.enter-password", "miniwob.login-user", "miniwob.enter-text-2")
SEEDS = (0, 1, 2)
REFERENCE_MISTAKES = MistakeConfig(detour_p=0.3, seed=0)
ROLLOUT_MISTAKES = MistakeConfig(wrong_element_p=0.2, early_stop_p=0.12, seed=7)
MODES = {"wrong_element": "wrong_element", "early_stop": "premature_stop"}


def _config():
    config = base_config()
    config.collect.workers, config.collect.max_steps, config.collect.progress = 2, 12, False
    return config


def test_rollouts_resume_and_diverge_at_the_injected_mistake(tmp_path):
    known = {t.id: t for t in load_miniwob_tasks()}
    judge = ProgrammaticJudge(success="solved")
    reference = tmp_path / "store"
    collector_teacher = ScriptedTeacher(REFERENCE_MISTAKES, tasks=TASKS)
    policy = ScriptedTeacher(ROLLOUT_MISTAKES, tasks=TASKS, name="rollout-teacher")
    with MiniWoBSuite() as suite:
        with store_writer(reference, policy=collector_teacher.name) as store:
            RetryCollector(suite, collector_teacher, judge, store, collect_settings(attempts=1, workers=2, max_steps=12,
                           progress=False)).run([known[t] for t in TASKS], SEEDS)
        groups = reference_task_groups(reference)
        first = groups[: len(groups) // 2]
        store_dir, summary = run_rollouts(_config(), tmp_path, policy, first, suite=suite, judge=judge)
        assert store_dir == rollout_store_dir(tmp_path, "rollout-teacher") == tmp_path / "mine/rollouts/rollout-teacher"
        assert (summary.collected, summary.skipped) == (len(first), 0)
        # A rerun over every group runs only those not stored yet.
        _, summary = run_rollouts(_config(), tmp_path, policy, groups, suite=suite, judge=judge)
        assert (summary.collected, summary.skipped) == (len(groups) - len(first), len(first))
        # The store is this policy's: another one is refused there.
        with pytest.raises(StoreError, match="holds the trajectories of policy 'rollout-teacher'"):
            store_writer(store_dir, policy="another-policy")

    rollouts = TrajectoryStore(store_dir)
    trajectories = {t.key: t for t in rollouts.trajectories()}
    assert set(trajectories) == {(t.id, s) for t, s in groups} and all(t.attempt == 1 for t in trajectories.values())
    ref_store = TrajectoryStore(reference)
    references = {t.key: ref_store.steps(t) for t in ref_store.trajectories() if t.success}

    for skip in (("detour",), ()):
        report = find_divergences(reference, store_dir, skip_labels=skip, repetition_window=3)
        assert report.counts["no_reference"] == 0 and report.counts["undecided"] == 0
        by_key = {d.state.key: d for d in report.divergences}
        checked = 0
        for key, traj in trajectories.items():
            mistakes = policy.injected(traj.request_id)
            if traj.success or not mistakes:
                continue
            first_mistake = mistakes[0]
            steps = references[key]
            detours = [s.step for s in steps if s.label == "detour"]
            assert all(s.label in (None, "detour") for s in steps)
            if skip:  # the rollout's j-th step meets the reference's j-th step that is not a detour
                expected = [s for s in steps if s.label is None][first_mistake.step].step
                label, mode = None, MODES[first_mistake.kind]
            else:  # step by step: a reference detour before the mistake is met first
                expected = min([*detours, first_mistake.step])
                label = "detour" if expected in detours else None
                mode = "wrong_action_type" if label else MODES[first_mistake.kind]
                if expected == first_mistake.step and first_mistake.kind == "early_stop":
                    mode = "premature_stop"  # an answer where the reference goes on, detour or not
            d = by_key[key]
            assert (d.state.step, d.state.teacher_label, d.state.prefix_matched) == (expected, label, True), key
            assert d.state.failure_mode == mode and d.rollout_step == expected - (len(
                [s for s in detours if s < expected]) if skip else 0), key
            assert d.state.reference_action == steps[expected].action
            checked += 1
        assert checked >= 2, report.counts  # enough failed rollouts with a known mistake to mean something
