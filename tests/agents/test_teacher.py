"""ScriptedTeacher on real MiniWoB++ pages in real Chromium: it solves its task types, injected
mistakes make it fail, its reflections name the mistaken steps, and a retry carrying them
avoids them (the teacher is a scripted stand-in for an LLM collector, not a result)."""
import collections
import dataclasses
import re

import pytest

from rmsweb_jax.agents import miniwob_solvers as solvers_module
from rmsweb_jax.agents import teacher as teacher_module
from rmsweb_jax.agents.miniwob_solvers import plan
from rmsweb_jax.agents.policy import PastStep, ReflectionRequest, StepContext
from rmsweb_jax.agents.teacher import (KIND_WORDS, SOLVED_TASKS, MistakeConfig, ScriptedTeacher, episode_identity,
                                       parse_reflections)
from rmsweb_jax.suites.miniwob import MiniWoBSuite, load_miniwob_tasks
from rmsweb_jax.web.action_text import format_action
from rmsweb_jax.web.elements import BBox, Element, element_at
from rmsweb_jax.web.episode import EpisodeRequest
from rmsweb_jax.web.observation import Observation
from rmsweb_jax.web.sync_pool import WorkerPool

MISTAKES = MistakeConfig(wrong_element_p=0.15, detour_p=0.15, early_stop_p=0.08, seed=7)
# Tasks where a careless agent has something to confuse the target with, plus a few without.
MISTAKE_TASKS = ("miniwob.click-button", "miniwob.click-button-sequence", "miniwob.click-checkboxes",
                 "miniwob.click-dialog-2", "miniwob.click-link", "miniwob.click-option", "miniwob.click-tab",
                 "miniwob.enter-password", "miniwob.enter-text", "miniwob.focus-text-2", "miniwob.login-user",
                 "miniwob.choose-list")
MISTAKE_SEEDS = range(6)


class TeacherPolicy:
    """The pool's policy callable over a teacher: builds the StepContext a collector would (the
    instruction, current observation, earlier steps as text, the reflections for this request)
    and keeps each step's thought for the ReflectionRequest."""

    def __init__(self, teacher, reflections=None):
        self.teacher = teacher
        self.reflections = reflections or {}
        self.thoughts = {}

    def __call__(self, history):
        request_id = history.request.request_id
        step = len(history.actions)
        past = tuple(PastStep(o.screenshot, o.url, self.thoughts[(request_id, i)], format_action(a))
                     for i, (o, a) in enumerate(zip(history.observations, history.actions)))
        ctx = StepContext(task_id=history.request.task.id, instruction=history.instruction,
                          observation=history.observation, history=past,
                          reflections=self.reflections.get(request_id, ()),
                          attempt=attempt_of(request_id), step=step, key=f"{request_id}/{step}")
        out = self.teacher.act([ctx])[0]
        assert out.action is not None and out.error is None and out.thought, out
        self.thoughts[(request_id, step)] = out.thought
        return out.action

    def reflection_request(self, episode, verdict_reason):
        rid = episode.request.request_id
        steps = tuple(PastStep(o.screenshot, o.url, self.thoughts[(rid, i)], format_action(a))
                      for i, (o, a) in enumerate(zip(episode.observations, episode.actions)))
        return ReflectionRequest(task_id=episode.request.task.id, instruction=episode.instruction,
                                 attempt=attempt_of(rid), steps=steps, verdict="failure",
                                 verdict_reason=verdict_reason, earlier_reflections=self.reflections.get(rid, ()),
                                 key=rid)


def attempt_of(request_id):
    return int(request_id.rsplit("@", 1)[1].rstrip("x"))


def request(tasks, name, seed, attempt, max_steps=8):
    return EpisodeRequest(tasks[name], seed=seed, max_steps=max_steps, request_id=f"{name}#{seed}@{attempt}")


@pytest.fixture(scope="module")
def miniwob_tasks():
    return {t.id: t for t in load_miniwob_tasks()}


@pytest.fixture(scope="module")
def pool():
    with MiniWoBSuite() as suite, WorkerPool(suite, workers=2) as pool:
        yield pool


# --- no browser -------------------------------------------------------------------------------
def blank_observation(instruction="Do something."):
    return Observation(url="http://127.0.0.1/x.html", title="", screenshot=b"", viewport=(500, 240),
                       screenshot_size=(500, 240), elements=(), focused_id=None, instruction=instruction)


def test_mistake_config_validates_and_round_trips():
    assert MistakeConfig.from_dict(MISTAKES.to_dict()) == MISTAKES
    for bad in ({"detour_p": 1.5}, {"wrong_element_p": -0.1}, {"detour_p": 0.6, "early_stop_p": 0.6},
                {"detour_p": True}):
        with pytest.raises(ValueError, match="MistakeConfig"):
            MistakeConfig(**bad)
    with pytest.raises(KeyError, match="unknown keys"):
        MistakeConfig.from_dict({"detour": 0.1})


def test_mistake_draws_depend_on_task_seed_and_step_not_attempt():
    config = MistakeConfig(wrong_element_p=0.2, detour_p=0.2, early_stop_p=0.1, seed=3)
    draws = [config.draw("miniwob.click-tab", f"miniwob.click-tab#{s}", step) for s in range(200) for step in range(3)]
    counts = collections.Counter(draws)
    # 600 draws: each kind near its probability, so the draw is neither constant nor broken.
    assert 80 < counts["wrong_element"] < 160 and 80 < counts["detour"] < 160 and 30 < counts["early_stop"] < 90
    assert draws == [config.draw("miniwob.click-tab", f"miniwob.click-tab#{s}", step)
                     for s in range(200) for step in range(3)]
    assert draws != [MistakeConfig(0.2, 0.2, 0.1, seed=4).draw("miniwob.click-tab", f"miniwob.click-tab#{s}", step)
                     for s in range(200) for step in range(3)]
    obs = blank_observation()
    ids = [episode_identity(StepContext("miniwob.click-tab", "x", obs, key=f"miniwob.click-tab#5@{a}/2"))
           for a in (1, 2)]
    assert ids == [("miniwob.click-tab#5@1", "miniwob.click-tab#5"), ("miniwob.click-tab#5@2", "miniwob.click-tab#5")]


def test_reflections_parse_back_to_steps_and_kinds():
    text = ('Attempt 1 failed (failure). Step 2 (wrong element): I clicked the "Cancel" button, but ... '
            "Steps 1, 3 (needless detour): step 1 waited; step 3 scrolled down. Step 4 (early stop): ...")
    assert parse_reflections([text]) == {(1, "wrong_element"), (0, "detour"), (2, "detour"), (3, "early_stop")}
    assert parse_reflections(["The agent should have clicked OK.", ""]) == set()
    assert set(KIND_WORDS) == {"wrong_element", "detour", "early_stop"}


def test_unsupported_tasks_are_refused_up_front_or_answered_with_a_reason():
    with pytest.raises(ValueError, match=r"no solver for tasks \['miniwob.drag-box'\]"):
        ScriptedTeacher(tasks=["miniwob.click-button", "miniwob.drag-box"])
    teacher = ScriptedTeacher(tasks=["miniwob.click-button"])
    ctx = StepContext("miniwob.drag-box", "Drag the box.", blank_observation(), key="miniwob.drag-box#0@1/0")
    out = teacher.act([ctx])[0]
    assert out.action.name == "answer" and "no solver" in out.thought and teacher.stats()["unsupported"] == 1
    assert len(SOLVED_TASKS) >= 12 and all(t.startswith("miniwob.") for t in SOLVED_TASKS)
    for module in (teacher_module, solvers_module):  # the documented list is the real one
        listed = re.search(r"\n\n((?:    [a-z0-9-]+(?:, [a-z0-9-]+)*,?\n)+)", module.__doc__).group(1)
        assert sorted("miniwob." + n for n in re.findall(r"[a-z0-9-]+", listed)) == list(SOLVED_TASKS)


def sequence_page(instruction="Click button ONE, then click button TWO."):
    # click-button-sequence as the page reader reports it (seed 43): TWO is painted over most of ONE.
    one = Element(3, "button", "ONE", BBox(66, 74, 40, 40), focusable=True, z=2)
    two = Element(4, "button", "TWO", BBox(73, 75, 40, 40), focusable=True, z=3)
    text = Element(33, "StaticText", instruction, BBox(3, 3, 79.48, 11), z=1)
    return dataclasses.replace(blank_observation(instruction), elements=(text, one, two))


def clicked(out, obs):
    assert out.action is not None and out.action.name == "left_click", out
    return element_at(obs.elements, *obs.coordinate_space.to_css(out.action.coordinate, obs.viewport)).name


def test_teacher_steps_through_its_plan_and_consumes_its_reflection():
    obs = sequence_page()
    task = "miniwob.click-button-sequence"

    def ctx(step, attempt=1, reflections=()):
        return StepContext(task, obs.instruction, obs, reflections=reflections, attempt=attempt, step=step,
                           key=f"{task}#43@{attempt}/{step}")

    teacher = ScriptedTeacher()
    outs = [teacher.act([ctx(s)])[0] for s in range(3)]
    # The point avoids the part of ONE that TWO covers; then TWO; then nothing is left to do.
    assert [clicked(o, obs) for o in outs[:2]] == ["ONE", "TWO"] and outs[2].action.name == "answer"
    assert outs[0].thought.startswith("The task: Click button ONE") and "button TWO" in outs[1].thought
    assert teacher.act([ctx(0)])[0] == outs[0]  # the same step again (a re-run from reset)
    assert [o.label for o in outs] == [None, None, None]  # planned moves and "done" carry no label

    wrong = ScriptedTeacher(MistakeConfig(wrong_element_p=1.0))
    first = wrong.act([ctx(0)])[0]
    assert clicked(first, obs) == "TWO" and [m.kind for m in wrong.injected(f"{task}#43@1")] == ["wrong_element"]
    assert first.label == "wrong_element"
    text = wrong.reflect(ReflectionRequest(task, obs.instruction, 1, (), "failure", "failure", key=f"{task}#43@1"))
    assert text.startswith("Attempt 1 failed (failure). Step 1 (wrong element): I clicked the \"TWO\" button")
    assert parse_reflections([text]) == {(0, "wrong_element")} and wrong.injected(f"{task}#43@1") == ()
    retry = wrong.act([ctx(0, attempt=2, reflections=(text,))])[0]
    assert clicked(retry, obs) == "ONE" and wrong.stats()["avoided_wrong_element"] == 1 and retry.label is None
    # Step 2 was never reflected on: the mistake drawn there still happens.
    assert clicked(wrong.act([ctx(1, attempt=2, reflections=(text,))])[0], obs) == "ONE"
    assert wrong.stats()["injected_wrong_element"] == 2


def test_memory_is_bounded_and_forgotten_attempts_are_said_so():
    obs = sequence_page()
    task = "miniwob.click-button-sequence"
    teacher = ScriptedTeacher(MistakeConfig(detour_p=1.0), memory_size=1)
    for seed in (1, 2):
        out = teacher.act([StepContext(task, obs.instruction, obs, step=0, key=f"{task}#{seed}@1/0")])[0]
        assert out.label == "detour"
    assert teacher.injected(f"{task}#1@1") == () and len(teacher.injected(f"{task}#2@1")) == 1
    text = teacher.reflect(ReflectionRequest(task, obs.instruction, 1, (), "failure", "", key=f"{task}#1@1"))
    assert "no record of this attempt" in text and parse_reflections([text]) == set()
    out = teacher.act([StepContext(task, obs.instruction, obs, step=1, key=f"{task}#1@1/1")])[0]
    assert out.action.name == "answer" and "lost track" in out.thought and teacher.stats()["lost_track"] == 1


# --- real browser -----------------------------------------------------------------------------
@pytest.mark.browser
def test_every_solved_task_succeeds_without_mistakes(pool, miniwob_tasks):
    teacher = ScriptedTeacher(tasks=SOLVED_TASKS)
    policy = TeacherPolicy(teacher)
    requests = [request(miniwob_tasks, name, seed, 1, max_steps=16) for name in SOLVED_TASKS for seed in (101, 102)]
    episodes = list(pool.run(requests, policy))
    # Full reward, not just success: MiniWoB counts a partly right click-checkboxes as reward > 0.
    failed = {e.request.request_id: (e.reward, e.reason, e.instruction) for e in episodes if e.reward != 1.0}
    assert not failed
    for e in episodes:  # no mistakes: exactly the plan's moves, one per step
        assert len(e.actions) == len(plan(e.request.task.id, e.instruction, e.observations[0])), e.request.request_id
    stats = teacher.stats()
    assert stats["steps"] == sum(len(e.actions) for e in episodes) and stats["episodes"] == len(requests)
    assert stats["mistakes_injected"] == 0 and stats["solver_errors"] == 0


@dataclasses.dataclass
class MistakeRun:
    teacher: ScriptedTeacher
    attempts: dict            # attempt number -> {(task, seed): Episode}
    injected: dict            # request id -> tuple[InjectedMistake]
    reflections: dict         # (task, seed) -> tuple of reflection texts written so far
    repeats: dict             # (task, seed) -> Episode of attempt 2 run WITHOUT reflections
    policy: TeacherPolicy


@pytest.fixture(scope="module")
def mistake_run(pool, miniwob_tasks):
    """Attempts 1-3 with mistakes on over MISTAKE_TASKS x MISTAKE_SEEDS, each retry of a failed
    episode carrying the teacher's reflections; plus attempt 2 of attempt 1's failures without
    reflections."""
    teacher = ScriptedTeacher(MISTAKES)
    policy = TeacherPolicy(teacher)
    attempts, injected, reflections = {}, {}, collections.defaultdict(tuple)
    todo = [(name, seed) for name in MISTAKE_TASKS for seed in MISTAKE_SEEDS]
    repeats = {}
    for attempt in (1, 2, 3):
        requests = [request(miniwob_tasks, name, seed, attempt) for name, seed in todo]
        if attempt == 2:  # the same episode again, no reflection: its own request ids
            requests += [dataclasses.replace(request(miniwob_tasks, name, seed, 2), request_id=f"{name}#{seed}@2x")
                         for name, seed in todo]
        attempts[attempt] = {}
        for e in pool.run(requests, policy):
            key = (e.request.task.id, e.request.seed)
            injected[e.request.request_id] = teacher.injected(e.request.request_id)
            if e.request.request_id.endswith("@2x"):
                repeats[key] = e
            else:
                attempts[attempt][key] = e
        todo = [k for k, e in attempts[attempt].items() if not e.success]
        for key in todo:
            e = attempts[attempt][key]
            reflections[key] += (teacher.reflect(policy.reflection_request(e, e.reason or "failure")),)
            policy.reflections[f"{key[0]}#{key[1]}@{attempt + 1}"] = reflections[key]
    return MistakeRun(teacher, attempts, injected, dict(reflections), repeats, policy)


@pytest.mark.browser
def test_mistakes_make_the_teacher_fail(mistake_run):
    first = mistake_run.attempts[1]
    rate = sum(bool(e.success) for e in first.values()) / len(first)
    stats = mistake_run.teacher.stats()
    print(f"\nsuccess@1 with mistakes {MISTAKES.to_dict()}: {rate:.2f} over {len(first)} episodes; stats {stats}")
    assert rate < 0.8  # without mistakes every one of these succeeds (test above)
    assert all(stats[f"injected_{k}"] > 0 for k in KIND_WORDS)
    # Every failure has an injected mistake behind it.
    for (name, seed), e in first.items():
        if not e.success:
            assert mistake_run.injected[f"{name}#{seed}@1"], (name, seed, e.reason)


@pytest.mark.browser
def test_same_seed_without_reflection_repeats_the_mistakes(mistake_run):
    assert mistake_run.repeats
    for key, again in mistake_run.repeats.items():
        first = mistake_run.attempts[1][key]
        assert again.success == first.success and again.reason == first.reason, key
        assert [a.to_arguments() for a in again.actions] == [a.to_arguments() for a in first.actions]
        assert [(m.step, m.kind) for m in mistake_run.injected[f"{key[0]}#{key[1]}@2x"]] == \
               [(m.step, m.kind) for m in mistake_run.injected[f"{key[0]}#{key[1]}@1"]]


@pytest.mark.browser
def test_reflection_names_each_mistaken_step(mistake_run):
    for (name, seed), e in mistake_run.attempts[1].items():
        if e.success:
            continue
        text = mistake_run.reflections[(name, seed)][0]
        mistakes = mistake_run.injected[f"{name}#{seed}@1"]
        assert parse_reflections([text]) == {(m.step, m.kind) for m in mistakes}, text
        for m in mistakes:
            action = e.actions[m.step]
            if m.kind == "wrong_element":
                # The reflection names the element the click really landed on, and the right one.
                assert f"Step {m.step + 1} (wrong element)" in text and m.wanted in text
                landed = action.target.element
                assert landed is not None and (landed.name.strip() in text or "number" in m.did), (text, landed)
            elif m.kind == "early_stop":
                assert action.name == "answer" and m.step == len(e.actions) - 1
            else:
                assert action.name in ("hover", "scroll", "wait") and "needless detour" in text


@pytest.mark.browser
def test_retry_with_reflections_avoids_the_named_mistakes(mistake_run):
    first, second, third = (mistake_run.attempts[a] for a in (1, 2, 3))
    assert second, "no attempt 1 failed: the mistake rates are too low to test retries"
    for key, e in second.items():
        named = parse_reflections(mistake_run.reflections[key][:1])
        again = {(m.step, m.kind) for m in mistake_run.injected[f"{key[0]}#{key[1]}@2"]}
        assert not named & again, (key, named, again)
        # One-move tasks have nothing left to get wrong once step 1 is right.
        if len(plan(key[0], e.instruction, e.observations[0])) == 1:
            assert e.success, (key, mistake_run.reflections[key], e.reason)
    n = len(first)
    at_1 = sum(bool(e.success) for e in first.values())
    at_2 = at_1 + sum(bool(e.success) for e in second.values())
    at_3 = at_2 + sum(bool(e.success) for e in third.values())
    print(f"\nsuccess@1 {at_1}/{n}, @<=2 {at_2}/{n}, @<=3 {at_3}/{n}; retried: {len(second)}, then {len(third)}")
    assert at_1 < at_2 <= at_3 and at_3 >= 0.9 * n
    assert sum(bool(e.success) for e in second.values()) >= 0.5 * len(second)
    stats = mistake_run.teacher.stats()
    named = sum(len(parse_reflections(r[:1])) for r in mistake_run.reflections.values())
    assert stats["mistakes_avoided"] >= named // 2
    # Detours named in a reflection are not taken again, so those retries are shorter.
    for key, e in second.items():
        if e.success:
            detours = [m.step for m in mistake_run.injected[f"{key[0]}#{key[1]}@2"] if m.kind == "detour"]
            assert len(e.actions) == len(plan(key[0], e.instruction, e.observations[0])) + len(detours)
