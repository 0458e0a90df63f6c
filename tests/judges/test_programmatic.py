"""The programmatic judge reads MiniWoB++'s raw reward under a success rule ("solved" or
"positive_reward"); the factory builds every judge by name."""
import math

import pytest

from rmsweb_jax.judges import (ProgrammaticJudge, Verdict, WebJudge, WebTailBenchJudge, WebVoyagerJudge, make_judge)
from rmsweb_jax.judges.base import JudgeInput
from rmsweb_jax.suites import load_miniwob_tasks


@pytest.fixture(scope="module")
def click_button():
    tasks = {t.id: t for t in load_miniwob_tasks()}
    return tasks["miniwob.click-button"]


def attempt(task, **kw) -> JudgeInput:
    return JudgeInput(task=task, instruction="Click on the \"Submit\" button.", steps=(), **kw)


@pytest.mark.parametrize("rule, reward, outcome", [
    ("solved", 1, "success"), ("solved", 1.0 - 1e-7, "success"), ("solved", 1.0 - 1e-5, "failure"),
    ("solved", 0.83, "failure"), ("solved", 0.6, "failure"), ("solved", 1e-6, "failure"), ("solved", 0.0, "failure"),
    ("solved", -1.0, "failure"),
    # The old rule: any positive reward, partial credit included.
    ("positive_reward", 1, "success"), ("positive_reward", 0.83, "success"), ("positive_reward", 1e-6, "success"),
    ("positive_reward", 0.0, "failure"), ("positive_reward", -1.0, "failure")])
def test_the_rule_decides_on_the_raw_reward(click_button, rule, reward, outcome):
    verdict = ProgrammaticJudge(success=rule).judge(attempt(click_button, reward=reward))
    assert verdict.outcome == outcome and rule in verdict.reason
    assert verdict.score == pytest.approx(reward) and verdict.calls == 0 and verdict.judge == "programmatic"


def test_unknown_rule_is_refused():
    with pytest.raises(ValueError, match=r"success 'partial': expected one of \['positive_reward', 'solved'\]"):
        ProgrammaticJudge(success="partial")
    with pytest.raises(TypeError):
        ProgrammaticJudge()  # the rule comes from config.collect.success; no default here


@pytest.mark.parametrize("rule", ["solved", "positive_reward"])
def test_reward_wins_over_suite_flag(click_button, rule):
    # The reward is the measured quantity; a contradicting flag does not override it.
    judge = ProgrammaticJudge(success=rule)
    assert judge.judge(attempt(click_button, reward=-1.0, suite_success=True)).outcome == "failure"


@pytest.mark.parametrize("flag, outcome", [(True, "success"), (False, "failure")])
def test_suite_flag_without_reward(click_button, flag, outcome):
    assert ProgrammaticJudge(success="solved").judge(attempt(click_button, suite_success=flag)).outcome == outcome


@pytest.mark.parametrize("reward", [None, math.nan, math.inf, "1", True, 10**400])
def test_missing_or_bad_reward_is_an_error(click_button, reward):
    verdict = ProgrammaticJudge(success="solved").judge(attempt(click_button, reward=reward))
    assert verdict.outcome == "error" and not verdict.success
    assert "reward" in verdict.reason
    assert Verdict.from_dict(verdict.to_dict()) == verdict


def test_make_judge_builds_each_judge_and_names_bad_input():
    chat = lambda messages: "SUCCESS"  # noqa: E731 — stands in for the judge LLM
    assert make_judge("programmatic", success="positive_reward").success == "positive_reward"
    assert isinstance(make_judge("webvoyager", chat, max_screenshots=15), WebVoyagerJudge)
    assert make_judge("webvoyager", chat, max_screenshots=15).max_screenshots == 15
    assert isinstance(make_judge("webjudge", chat, score_threshold=4), WebJudge)
    assert isinstance(make_judge("webtailbench", chat, threshold=0.9), WebTailBenchJudge)
    with pytest.raises(ValueError, match="unknown judge 'gpt'"):
        make_judge("gpt", chat)
    with pytest.raises(ValueError, match="LLM judge: pass chat"):
        make_judge("webjudge")
    with pytest.raises(ValueError, match="takes no chat"):
        make_judge("programmatic", chat, success="solved")
    with pytest.raises(TypeError):
        make_judge("webvoyager", chat, k=3)
    with pytest.raises(ValueError, match="max_screenshots"):
        make_judge("webvoyager", chat, max_screenshots=0)
    with pytest.raises(ValueError, match="score_threshold"):
        make_judge("webjudge", chat, score_threshold=6)
    with pytest.raises(ValueError, match="threshold"):
        make_judge("webtailbench", chat, threshold=1.5)
