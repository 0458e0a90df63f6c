"""Acceptance of the retry loop on MiniWoB++ in real Chromium with the ScriptedTeacher (mistakes
on, K=3): retries raise the yield, every attempt is stored, and the report's figures equal what
this test recomputes from the store's records; browser-fault reruns (a real SIGKILL of the
browser) take no attempt number and are no retry success. (The teacher is a scripted stand-in
for an LLM collector; its rates are not a result.)"""
import collections
import dataclasses
import os
import signal

import pytest

from rmsweb_jax.agents.policy import PolicyOutput
from rmsweb_jax.agents.teacher import MistakeConfig, ScriptedTeacher
from rmsweb_jax.collect.report import write_report
from rmsweb_jax.collect.retries import RetryCollector
from rmsweb_jax.collect.sft_view import SFTView
from rmsweb_jax.collect.store import TrajectoryStore
from rmsweb_jax.judges.programmatic import ProgrammaticJudge
from rmsweb_jax.suites.miniwob import MiniWoBSuite, load_miniwob_tasks
from rmsweb_jax.suites.success_rule import is_solved
from rmsweb_jax.web.browser import marked_pids
from tests.collect.wrapped_policy import WrappedPolicy
from tests.settings import collect_settings, store_writer

pytestmark = pytest.mark.browser

TASKS = ("miniwob.click-button", "miniwob.click-button-sequence", "miniwob.click-checkboxes", "miniwob.click-dialog-2",
         "miniwob.click-link", "miniwob.click-option", "miniwob.click-tab", "miniwob.enter-password",
         "miniwob.enter-text", "miniwob.focus-text-2", "miniwob.login-user", "miniwob.choose-list")
SEEDS = (0, 1)
K = 3
MISTAKES = MistakeConfig(wrong_element_p=0.15, detour_p=0.15, early_stop_p=0.08, seed=0)
GARBLED = "miniwob.click-button#1@1/0"  # this turn comes back as text that is no action


class GarbleOneTurn(WrappedPolicy):
    """The teacher, except that one turn (by StepContext.key) is replaced by malformed text, as
    a model might write it; everything else is the teacher's."""

    def __init__(self, teacher, key):
        super().__init__(teacher)
        self.key = key

    def act(self, contexts):
        outputs = self.inner.act(contexts)
        return [PolicyOutput.from_text("I click Submit <tool_call>{\"name\": \"computer_use\"", c.observation)
                if c.key == self.key else o for c, o in zip(contexts, outputs)]


def _mean(values):
    return round(sum(values) / len(values), 3) if values else None


def test_retries_raise_yield_and_the_report_matches_the_store(tmp_path):
    known = {t.id: t for t in load_miniwob_tasks()}
    tasks = [known[name] for name in TASKS]
    policy = GarbleOneTurn(ScriptedTeacher(MISTAKES, tasks=TASKS), GARBLED)
    store_dir = tmp_path / "store"
    with MiniWoBSuite() as suite, store_writer(store_dir, flush_every_tasks=5) as store:
        collector = RetryCollector(suite, policy, ProgrammaticJudge(success="solved"), store,
                                   collect_settings(attempts=K, workers=2,
                                   max_steps=10, progress=False))
        summary = collector.run(tasks, SEEDS)
        assert summary.collected == len(TASKS) * len(SEEDS) and summary.skipped == 0
        # A second run over the same store finds nothing left to do.
        again = collector.run(tasks, SEEDS)
        assert again.collected == 0 and again.skipped == len(TASKS) * len(SEEDS) and again.trajectories == 0
    report = write_report(store_dir, tmp_path, attempts=K, success_rule="solved")
    assert {p.name for p in tmp_path.iterdir()} >= {"report.json", "report.md", "report.png"}

    # --- recompute everything from the raw records --------------------------------------
    reader = TrajectoryStore(store_dir)
    trajectories = list(reader.trajectories())
    steps = {t.request_id: reader.steps(t) for t in trajectories}
    groups = collections.defaultdict(list)
    for t in trajectories:
        groups[(t.task_id, t.seed)].append(t)
    assert sorted(groups) == sorted((task, seed) for task in TASKS for seed in SEEDS)
    assert len({t.request_id for t in trajectories}) == len(trajectories)  # nothing twice
    solved_first = solved = 0
    first_steps, retried_steps, retried_first_steps = [], [], []
    reflections_written = 0
    for key, group in groups.items():
        group.sort(key=lambda t: t.attempt)
        assert [t.attempt for t in group] == list(range(1, len(group) + 1))
        assert not any(t.success for t in group[:-1])  # retries stop at the first success
        assert group[-1].success or len(group) == K
        for t in group:
            assert t.request_id == f"{key[0]}#{key[1]}@{t.attempt}"
            assert len(steps[t.request_id]) == t.num_steps
            assert t.success == (t.reward is not None and is_solved(t.reward)) == t.verdict.success
            if t.status == "complete":  # no browser fault: one new reflection per failed attempt
                assert len(t.reflections) == t.attempt - 1
            if t.attempt > 1:
                assert t.reflections[:len(group[t.attempt - 2].reflections)] == group[t.attempt - 2].reflections
        reflections_written += len(group[-1].reflections)
        if group[0].success:
            solved_first += 1
            first_steps.append(len(steps[group[0].request_id]))
        if group[-1].success:
            solved += 1
            if len(group) > 1:
                retried_steps.append(len(steps[group[-1].request_id]))
                retried_first_steps.append(len(steps[group[0].request_id]))
    n = len(groups)
    all_steps = [s for ss in steps.values() for s in ss]
    assert report["tasks"] == n and report["trajectories"] == len(trajectories)
    assert report["steps"] == len(all_steps)
    assert report["solved_first"] == solved_first and report["solved"] == solved
    assert report["success_at_1"] == round(solved_first / n, 4)
    assert report["success_at_le_K"] == round(solved / n, 4)
    assert report["yield_gain"] == round(solved / n - solved_first / n, 4)
    assert report["mean_steps_solved_first_attempt"] == _mean(first_steps)
    assert report["mean_steps_solved_retried"] == _mean(retried_steps)
    assert report["mean_steps_failed_first_attempt_of_retried"] == _mean(retried_first_steps)
    assert report["judge"]["verdicts"] == sum(t.verdict.judge == "programmatic" for t in trajectories)
    assert report["policy"]["reflections_written"] == reflections_written == summary.bridge["reflect_calls"]
    assert report["policy"]["steps_acted"] == len(all_steps)
    assert report["policy"]["parse_errors"] == sum(s.parse_error is not None for s in all_steps) == 1
    assert report["policy"]["prompt_tokens"] == sum(s.prompt_tokens for s in all_steps)

    # --- the acceptance figure: retries raise the yield -----------------------------------
    assert report["success_at_le_K"] > report["success_at_1"], report
    assert report["yield_gain"] > 0

    # The garbled turn ran as a wait and is stored with its error; the click actions carry their
    # semantic target (the element clicked).
    bad = next(s for s in all_steps if s.parse_error is not None)
    assert f"{bad.request_id}/{bad.step}" == GARBLED
    assert bad.action.name == "wait" and bad.parse_error.startswith("invalid_json")
    clicks = [s for s in all_steps if s.action.name == "left_click"]
    assert clicks and all(s.target is not None and s.target.point is not None for s in clicks)
    assert sum(s.target.element is not None for s in clicks) > 0.9 * len(clicks)
    assert all(s.screenshot.startswith(b"\x89PNG") and s.elements for s in all_steps)

    # The SFT view: the successful attempts' steps only, no reflections, retried wins included.
    view = SFTView(store_dir)
    winners = {t.request_id for t in trajectories if t.success}
    assert len(view) == sum(t.num_steps for t in trajectories if t.success) - sum(
        1 for s in all_steps if s.parse_error is not None and s.request_id in winners)
    examples = [view[i] for i in range(len(view))]
    assert {ex.request_id for ex in examples} == {rid for rid in winners if steps[rid]}
    assert any(ex.attempt > 1 for ex in examples)
    texts = {r for t in trajectories for r in t.reflections}
    for ex in examples:
        ctx = ex.context()
        assert ctx.reflections == () and ex.step.parse_error is None
        assert not any(r in ex.instruction or r in ex.target_text for r in texts)
        assert dataclasses.asdict(ex).keys() == {"task_id", "seed", "attempt", "request_id", "instruction", "history",
                                                 "step"}


class FailsAt(WrappedPolicy):
    """The teacher until it is asked for the step with context key `key`: then it raises (an
    endpoint that goes down)."""

    def __init__(self, teacher, key):
        super().__init__(teacher)
        self.key = key

    def act(self, contexts):
        if any(c.key == self.key for c in contexts):
            raise ConnectionError("policy endpoint went away")
        return self.inner.act(contexts)


def test_a_policy_error_stops_the_run_and_keeps_finished_groups(tmp_path):
    known = {t.id: t for t in load_miniwob_tasks()}
    tasks = [known[name] for name in ("miniwob.click-button", "miniwob.click-link", "miniwob.enter-text")]
    # The last new task's second step: by then several groups have finished.
    policy = FailsAt(ScriptedTeacher(MISTAKES), "miniwob.enter-text#1@1/1")
    with pytest.raises(ConnectionError, match="policy endpoint went away"):
        with MiniWoBSuite() as suite, store_writer(tmp_path, flush_every_tasks=100) as store:
            RetryCollector(suite, policy, ProgrammaticJudge(success="solved"), store,
                           collect_settings(attempts=K, workers=2,
                           max_steps=10, progress=False)).run(tasks, SEEDS)
    # Groups that finished before the error were committed when the writer closed; each whole.
    groups = TrajectoryStore(tmp_path).groups()
    assert 0 < len(groups) < len(tasks) * len(SEEDS)
    for attempts in groups.values():
        assert [t.attempt for t in attempts] == list(range(1, len(attempts) + 1))
        assert attempts[-1].success or len(attempts) == K


class KillsBrowserAt(WrappedPolicy):
    """The teacher, except that just before answering the step with context key `key` it
    SIGKILLs the run's browser (worker 0's Chromium): a real crash in the middle of the attempt.
    Only the first time: the rerun of the same step goes through."""

    def __init__(self, teacher, key):
        super().__init__(teacher)
        self.key = key
        self.collector, self.killed = None, []

    def act(self, contexts):
        if any(c.key == self.key for c in contexts) and not self.killed:
            self.killed.append(self.collector.pool.browser_pid(0))
            os.kill(self.killed[0], signal.SIGKILL)
        return self.inner.act(contexts)


@pytest.mark.parametrize("fault_reruns", [1, 0])
def test_browser_fault_reruns_take_no_attempt_number(tmp_path, fault_reruns):
    # pool_max_attempts=1: the pool does not rerun by itself, so the crash reaches the collector.
    task = next(t for t in load_miniwob_tasks() if t.id == "miniwob.enter-text")
    policy = KillsBrowserAt(ScriptedTeacher(MistakeConfig(0.0, 0.0, 0.0)), "miniwob.enter-text#0@1/1")
    with MiniWoBSuite() as suite, store_writer(tmp_path / "store") as store:
        collector = RetryCollector(suite, policy, ProgrammaticJudge(success="solved"), store,
                                   collect_settings(attempts=K, workers=1,
                                   max_steps=5, pool_max_attempts=1, fault_reruns=fault_reruns, progress=False))
        policy.collector = collector
        summary = collector.run([task], [0])
    assert len(policy.killed) == 1 and policy.killed[0] not in marked_pids(summary.pool_marker)
    (group,) = TrajectoryStore(tmp_path / "store").groups().values()
    report = write_report(tmp_path / "store", tmp_path, attempts=K, success_rule="solved")
    (attempt,) = group  # one attempt either way: the fault took no attempt number
    assert attempt.attempt == 1 and attempt.reflections == () and len(attempt.faults) == 1, attempt.faults
    if fault_reruns:  # the same attempt ran again and solved the task: solved on attempt 1, not on a retry
        assert attempt.success and attempt.status == "complete" and attempt.num_steps == 2
        assert summary.fault_reruns == 1 and summary.lost_to_faults == 0 and summary.solved_first == 1
        assert report["solved_at_attempt"] == {"1": 1, "2": 0, "3": 0} and report["yield_gain"] == 0
        assert report["browser_faults"] == {"faults": 1, "attempts_rerun": 1, "attempts_lost": 0}
    else:  # no rerun allowed: the attempt is lost and ends its group unsolved, with no retry
        assert not attempt.success and attempt.status == "failed" and attempt.verdict.judge == "pool"
        assert summary.fault_reruns == 0 and summary.lost_to_faults == 1 and summary.solved == 0
        assert report["solved"] == 0 and report["browser_faults"] == {"faults": 1, "attempts_rerun": 0,
                                                                       "attempts_lost": 1}
        assert report["judge"]["verdicts"] == 0 and report["policy"]["reflections_written"] == 0
