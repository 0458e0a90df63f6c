"""collect.retry_mode "plain" against "reflection" on MiniWoB++ in real Chromium with the
ScriptedTeacher (mistakes on, K=2, the same tasks and seeds): plain retries carry no reflection
and call no reflect(), and are a fresh draw (some groups fail attempt 1 and are solved on attempt
2 without a reflection; without the re-draw a plain retry is attempt 1 step for step); the
reflection store has its reflections; attempt 1 is the same run in both modes; the store records
its mode and refuses the other one, through the collect stage too. (The teacher is a scripted
stand-in for an LLM collector; its rates are not a result.)"""
import dataclasses

import pytest

from rmsweb_jax.agents.teacher import MistakeConfig, ScriptedTeacher
from rmsweb_jax.collect.report import write_report
from rmsweb_jax.collect.retries import RetryCollector
from rmsweb_jax.collect.store import StoreError, TrajectoryStore
from rmsweb_jax.collect.store_fixture import retry_group
from rmsweb_jax.errors import UserError
from rmsweb_jax.judges.programmatic import ProgrammaticJudge
from rmsweb_jax.suites.miniwob import MiniWoBSuite, load_miniwob_tasks
from tests.collect.wrapped_policy import WrappedPolicy
from tests.settings import collect_settings, store_writer

pytestmark = pytest.mark.browser

TASKS = ("miniwob.click-dialog", "miniwob.focus-text-2", "miniwob.click-button", "miniwob.enter-text")
SEEDS = tuple(range(5))
K = 2
# Many mistakes, so a good share of attempt 1s fail (the draws are seeded: the same groups every run).
MISTAKES = MistakeConfig(wrong_element_p=0.2, detour_p=0.1, early_stop_p=0.3, seed=0)


class SameDraw(WrappedPolicy):
    """The teacher, told that every attempt is draw 1 (what a plain retry would be without the re-draw)."""

    def act(self, contexts):
        return self.inner.act([dataclasses.replace(c, draw=1) for c in contexts])


def _collect(store_dir, mode, policy=None):
    """Returns ({(task, seed): [(trajectory, steps) per attempt]}, the policy's stats) of one collection."""
    known = {t.id: t for t in load_miniwob_tasks()}
    policy = policy or ScriptedTeacher(MISTAKES, tasks=TASKS)
    with MiniWoBSuite() as suite, store_writer(store_dir, policy=policy.name) as store:
        RetryCollector(suite, policy, ProgrammaticJudge(success="solved"), store,
                       collect_settings(attempts=K, workers=2, max_steps=8,
                       progress=False, retry_mode=mode)).run([known[t] for t in TASKS], SEEDS)
    stats = policy.stats()
    with TrajectoryStore(store_dir) as reader:
        assert reader.retry_mode == mode
        groups = {key: [(t, reader.steps(t)) for t in attempts] for key, attempts in reader.groups().items()}
    assert sorted(groups) == sorted((t, s) for t in TASKS for s in SEEDS)
    return groups, stats


def _run_of(attempt):
    trajectory, steps = attempt
    return trajectory.success, [s.action_text for s in steps], [s.label for s in steps]


@pytest.fixture(scope="module")
def collected(tmp_path_factory):
    root = tmp_path_factory.mktemp("modes")
    plain, plain_stats = _collect(root / "plain", "plain")
    reflection, reflection_stats = _collect(root / "reflection", "reflection")
    return root, plain, plain_stats, reflection, reflection_stats


def test_plain_retries_carry_no_reflection_and_draw_afresh(collected):
    root, plain, plain_stats, reflection, reflection_stats = collected
    retried = {k: g for k, g in plain.items() if len(g) == 2}
    assert retried, "no group failed attempt 1: raise the mistake rates"
    # No reflection anywhere, and reflect() was never called.
    assert all(t.reflections == () for g in plain.values() for t, _ in g)
    assert plain_stats["reflections"] == 0
    # A fresh draw: failed on attempt 1, solved on attempt 2, with nothing in context to say why.
    fixed = [k for k, g in retried.items() if not g[0][0].success and g[1][0].success]
    assert fixed, {k: [_run_of(a) for a in g] for k, g in retried.items()}
    assert any(_run_of(g[0])[1:] != _run_of(g[1])[1:] for g in retried.values())

    # Attempt 1 is the same run in both modes (draw 1, no reflections).
    assert {k: _run_of(g[0]) for k, g in plain.items()} == {k: _run_of(g[0]) for k, g in reflection.items()}
    # The reflection store retried the same groups, each retry with the reflection on attempt 1.
    assert {k for k, g in reflection.items() if len(g) == 2} == set(retried)
    assert all(len(g[1][0].reflections) == 1 and g[1][0].reflections[0].startswith("Attempt 1 failed")
               for k, g in reflection.items() if len(g) == 2)
    assert reflection_stats["reflections"] == len(retried)

    report = write_report(root / "plain", root / "plain_report", attempts=K, success_rule="solved")
    assert report["retry_mode"] == "plain" and report["policy"]["reflections_written"] == 0
    assert "| retry mode | plain (retries without reflections) |" in (root / "plain_report" / "report.md").read_text()
    assert report["solved"] == sum(g[-1][0].success for g in plain.values())


def test_a_plain_retry_without_the_redraw_is_attempt_1_again(tmp_path):
    # Why the draw exists: the teacher's mistakes are seeded per task and seed, so without it a plain
    # retry (no reflection to change anything) replays attempt 1 step for step and never fixes a group.
    groups, _ = _collect(tmp_path / "same", "plain", SameDraw(ScriptedTeacher(MISTAKES, tasks=TASKS)))
    retried = [g for g in groups.values() if len(g) == 2]
    assert retried
    assert all(_run_of(g[0]) == _run_of(g[1]) for g in retried)


def test_a_store_refuses_the_other_retry_mode(collected, tmp_path):
    root = collected[0]
    teacher = ScriptedTeacher(MISTAKES, tasks=TASKS)
    for store_dir, mode, other in ((root / "plain", "plain", "reflection"),
                                   (root / "reflection", "reflection", "plain")):
        with MiniWoBSuite() as suite, store_writer(store_dir, policy=teacher.name) as store:
            with pytest.raises(StoreError) as err:
                RetryCollector(suite, teacher, ProgrammaticJudge(success="solved"), store, collect_settings(attempts=K,
                               progress=False, retry_mode=other))
            RetryCollector(suite, teacher, ProgrammaticJudge(success="solved"), store, collect_settings(attempts=K,
                           progress=False, retry_mode=mode))  # the store's own mode is accepted
        message = str(err.value)
        assert f"collect.retry_mode={mode!r}" in message and f"collect.retry_mode is {other!r}" in message
        assert str(store_dir) in message and "collect.store_dir" in message
        assert TrajectoryStore(store_dir).retry_mode == mode  # the refused run recorded nothing

    # A store from before the setting (no mode recorded) holds reflection-conditioned groups.
    legacy = tmp_path / "legacy"
    with store_writer(legacy) as store:
        store.add_group(retry_group("miniwob.click-button", 0, solved_at=2))
    with store_writer(legacy) as store:
        with pytest.raises(StoreError, match="before collect.retry_mode existed"):
            store.claim_retry_mode("plain")
        store.claim_retry_mode("reflection")
    assert TrajectoryStore(legacy).retry_mode == "reflection"
    with pytest.raises(ValueError, match="retry_mode must be one of"):
        with MiniWoBSuite() as suite, store_writer(tmp_path / "new") as store:
            RetryCollector(suite, teacher, ProgrammaticJudge(success="solved"), store,
                           collect_settings(retry_mode="reflect"))


def test_the_collect_stage_passes_and_checks_retry_mode(tmp_path):
    from configs.demo import get_config
    from rmsweb_jax.stages import collect

    config = get_config()
    config.collect.tasks, config.collect.num_seeds, config.collect.flush_every_tasks = "click-button", 2, 1
    config.collect.retry_mode = "plain"
    report = collect.run(config, tmp_path)
    assert report["retry_mode"] == "plain" and TrajectoryStore(tmp_path / "store").retry_mode == "plain"
    assert "| retry mode | plain" in (tmp_path / "collect_report.md").read_text()
    config.collect.retry_mode = "reflection"
    with pytest.raises(StoreError, match="collect.retry_mode='plain'"):
        collect.run(config, tmp_path)
    config.collect.retry_mode = "none"
    with pytest.raises(UserError, match="collect.retry_mode 'none': expected 'reflection'"):
        collect.run(config, tmp_path)
