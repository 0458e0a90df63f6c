"""Success means solved, in real Chromium on MiniWoB++ click-checkboxes: an attempt that ticks one
box too many gets partial credit from the page ((#right - #wrong) / n = 0.6) and is not a success
under collect.success = "solved" (it is retried; the report shows its raw reward), while
"positive_reward" reproduces the old rule (the same attempt counts as solved)."""
import re

import pytest

from rmsweb_jax.agents.policy import PolicyOutput
from rmsweb_jax.collect.report import write_report
from rmsweb_jax.collect.retries import RetryCollector
from rmsweb_jax.collect.sft_view import SFTView
from rmsweb_jax.collect.store import TrajectoryStore
from rmsweb_jax.judges.programmatic import ProgrammaticJudge
from rmsweb_jax.suites.miniwob import MiniWoBSuite, load_miniwob_tasks
from rmsweb_jax.web.action_text import format_action
from rmsweb_jax.web.actions import RELATIVE, Action
from tests.settings import collect_settings, store_writer

pytestmark = pytest.mark.browser

TASK = "miniwob.click-checkboxes"
# Seed 3 shows five boxes, four of them asked for: one extra tick scores (4 - 1) / 5 = 0.6.
SEED = 3
PARTIAL = 0.6


class CheckboxPolicy:
    """Ticks the boxes the instruction names and clicks Submit; on attempt 1 it also ticks the
    first box nobody asked for (one wrong box). Reads only the instruction and the elements."""

    name = "checkbox-script"

    def __init__(self):
        self.plans, self.reflections = {}, 0

    def act(self, contexts):
        outputs = []
        for ctx in contexts:
            rid = ctx.key.rsplit("/", 1)[0]
            if ctx.step == 0:
                self.plans[rid] = self._plan(ctx.observation, wrong_box=ctx.attempt == 1)
            action = self.plans[rid][ctx.step]
            outputs.append(PolicyOutput.from_text(format_action(action, f"step {ctx.step}"), ctx.observation))
        return outputs

    @staticmethod
    def _plan(obs, *, wrong_box):
        wanted = re.match(r"Select (.*) and click Submit\.", obs.instruction).group(1)
        names = set() if wanted == "nothing" else {n.strip() for n in wanted.split(",")}
        boxes = [e for e in obs.elements if e.role == "checkbox"]
        ticks = [e for e in boxes if e.name.strip() in names]
        if wrong_box:
            ticks.append(next(e for e in boxes if e.name.strip() not in names))
        submit = next(e for e in obs.elements if e.role == "button" and e.name.strip() == "Submit")
        return [Action.click(*RELATIVE.from_css(e.bbox.center, obs.viewport)) for e in [*ticks, submit]]

    def reflect(self, request):
        self.reflections += 1
        return "Attempt 1 ticked a box the task did not name; tick only the named boxes."

    def stats(self):
        return {"reflections": self.reflections}

    def close(self):
        pass


def _collect(tmp_path, rule):
    task = next(t for t in load_miniwob_tasks() if t.id == TASK)
    store_dir = tmp_path / rule / "store"
    with MiniWoBSuite() as suite, store_writer(store_dir) as store:
        RetryCollector(suite, CheckboxPolicy(), ProgrammaticJudge(success=rule), store,
                       collect_settings(attempts=2, workers=1,
                       max_steps=8, progress=False)).run([task], [SEED])
    report = write_report(store_dir, tmp_path / rule, attempts=2, success_rule=rule)
    return sorted(TrajectoryStore(store_dir).trajectories(), key=lambda t: t.attempt), report, store_dir


def test_one_wrong_checkbox_is_not_a_success_and_the_report_shows_the_raw_reward(tmp_path):
    attempts, report, store_dir = _collect(tmp_path, "solved")
    first, second = attempts  # attempt 1 failed, so the retry ran
    assert first.reward == pytest.approx(PARTIAL) and first.done and not first.truncated
    assert not first.success and first.verdict.outcome == "failure" and first.suite_success is False
    assert first.verdict.score == pytest.approx(PARTIAL) and "not solved" in first.verdict.reason
    assert second.reward == 1.0 and second.success and len(second.reflections) == 1
    assert report["success_rule"] == "solved" and report["solved_at_attempt"] == {"1": 0, "2": 1}
    assert report["raw_reward"]["partial"] == 1
    assert report["raw_reward"]["mean_first_attempt"] == PARTIAL
    assert report["by_task"][TASK]["mean_raw_reward"] == round((PARTIAL + 1) / 2, 3)
    md = (tmp_path / "solved" / "report.md").read_text()
    assert "| success rule | solved (raw reward >= 1 - 1e-06) |" in md
    assert f"| {TASK} | 1 | 0 | 1 | 2 | 0.8 | 1 |" in md
    # The wrong tick is no SFT target: only the solving attempt's steps are.
    view = SFTView(store_dir)
    assert {view[i].attempt for i in range(len(view))} == {2} and len(view) == second.num_steps


def test_positive_reward_rule_reproduces_the_old_behaviour(tmp_path):
    attempts, report, store_dir = _collect(tmp_path, "positive_reward")
    (first,) = attempts  # the partial reward counted: no retry
    assert first.reward == pytest.approx(PARTIAL) and first.success and first.verdict.outcome == "success"
    assert first.suite_success is False  # the page's own "solved" flag still says it was not solved
    assert report["success_rule"] == "positive_reward" and report["solved_at_attempt"] == {"1": 1, "2": 0}
    assert report["raw_reward"]["partial"] == 1
    # Its wrong click became an SFT target, as before the rule existed.
    assert len(SFTView(store_dir)) == first.num_steps == 6
