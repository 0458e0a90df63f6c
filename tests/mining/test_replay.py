"""Replay mining. With a policy whose per-state accuracy is known (its K turns per state are written
out: j right, K - j wrong of a chosen kind), exactly the states below tau are critical, with the
majority failure mode; every teacher-labelled step is skipped; a turn cut by the token limit is wrong
in mining as in the rewards. The sampling path and the reference log-prob
run on a real random model: K turns per state, and log p(reference action) equal to log_softmax of
the model's own logits over the action-only span."""
import dataclasses
import time

import numpy as np
import pytest

from rmsweb_jax.agents.prompt import PromptBuilder, prompt_config_from
from rmsweb_jax.collect.sft_view import SFTView
from rmsweb_jax.collect.store_fixture import page_elements, task_group, write_synthetic_store
from rmsweb_jax.mining.replay import ReferenceLogprobs, ReplaySettings, classify, replay, sample_turns
from rmsweb_jax.web.action_text import CLOSE, format_action, parse_action
from rmsweb_jax.web.actions import RELATIVE, Action
from tests.settings import store_writer

K = 4
VIEWPORT = (200, 120)


def _config():
    from configs.common import base_config
    c = base_config()
    c.mesh.shape = (1, 1, 1)
    c.mine.samples = K
    c.mine.tau = 0.5
    c.mine.batch_states = 3
    c.mine.reference_logprob = False
    return c


@pytest.fixture(scope="module")
def view(tmp_path_factory):
    return SFTView(write_synthetic_store(tmp_path_factory.mktemp("store") / "store", tasks=2, seeds=2,
                                         viewport=VIEWPORT))


def _wrong_turn(example, kind: int) -> str:
    """A wrong turn for the example's step: an unparseable one, or the right action type on another element."""
    if kind == 0:
        return "I am not sure <tool_call>{broken"
    other = next(e for e in page_elements(example.step.viewport, 0) if e.name == "Back")
    if example.step.action.name == "left_click":  # a click elsewhere: another button, or none
        return format_action(Action.click(*RELATIVE.from_css(other.bbox.center, example.step.viewport)))
    return format_action(Action.click(990, 990))  # typing / answering: a click is the wrong action type


class KnownPolicy:
    """Answers each state's prompt with a fixed list of K turns: `right[i]` copies of the stored turn and
    K - right[i] wrong turns of kind `kinds[i]`, every one ended by `finish_reason`; recognizes the state by
    its exact prompt."""

    def __init__(self, view, builder, right, kinds, finish_reason="stop"):
        self.turns, self.finish_reason = {}, finish_reason
        for i in range(len(view)):
            ex = view[i]
            turns = [ex.target_text] * right[i] + [_wrong_turn(ex, kinds[i])] * (K - right[i])
            self.turns[repr(builder.messages(ex.context()))] = turns
        self.calls = []

    def __call__(self, chat_model, conversations, k, params, seed):
        assert k == K and params.temperature == 1.0
        self.calls.append(seed)
        return [[(t, self.finish_reason) for t in self.turns[repr(c)]] for c in conversations]


def test_exactly_the_states_below_tau_are_critical(view):
    config = _config()
    builder = PromptBuilder(prompt_config_from(config))
    n = len(view)
    right = [i % (K + 1) for i in range(n)]          # accuracies 0, 1/4, 1/2, 3/4, 1, 0, ...
    kinds = [(i // 2) % 2 for i in range(n)]
    policy = KnownPolicy(view, builder, right, kinds)
    for tau in (0.5, 0.75, 1.0):
        settings = dataclasses.replace(ReplaySettings.from_config(config.mine), tau=tau)
        result = replay(view, range(n), None, builder, settings, progress=False, sample=policy)
        assert [s.index for s in result.states] == list(range(n))
        assert [s.accuracy for s in result.states] == [r / K for r in right]
        assert {s.index for s in result.states if s.critical} == {i for i in range(n) if right[i] / K < tau}
        for s in result.states:
            ex = view[s.index]
            wrong_mode = ("invalid_format" if kinds[s.index] == 0 else
                          "wrong_element" if ex.step.action.name == "left_click" else "wrong_action_type")
            assert s.failure_mode == (wrong_mode if s.critical else "routine"), (s, ex.step.action)
            assert s.mode_counts == ({wrong_mode: K - right[s.index]} if right[s.index] < K else {})
            assert s.reference_logprob is None and s.samples == tuple(policy.turns[repr(builder.messages(ex.context()))])
        assert result.skipped == {}
        throughput = result.throughput
        assert throughput["states"] == n and throughput["samples"] == n * K and throughput["states_per_s"] > 0
        assert 0 <= throughput["sampling_share"] + throughput["scoring_share"] + throughput["logprob_share"] <= 1
    assert policy.calls[:4] == [0, 1, 2, 3]  # one seed per chunk of batch_states states


def test_the_rate_after_the_first_batch_leaves_its_time_out(view):
    """The first batch (the one that compiles) is timed apart: here its sampler call alone takes 0.5 s more."""
    config = _config()
    builder = PromptBuilder(prompt_config_from(config))
    n = len(view)
    policy = KnownPolicy(view, builder, [K] * n, [0] * n)

    def slow_first(*args):
        if not policy.calls:
            time.sleep(0.5)
        return policy(*args)
    settings = ReplaySettings.from_config(config.mine)
    assert n > settings.batch_states
    result = replay(view, range(n), None, builder, settings, progress=False, sample=slow_first)
    t = result.throughput
    assert result.first_batch[0] == t["first_batch_states"] == settings.batch_states
    assert 0.5 <= result.first_batch[1] <= result.seconds["total"]
    after = (n - settings.batch_states) / (result.seconds["total"] - result.first_batch[1])
    assert t["states_per_s_after_first_batch"] == pytest.approx(after) and after > t["states_per_s"]
    single = replay(view, range(settings.batch_states), None, builder, settings, progress=False, sample=policy)
    assert single.throughput["states_per_s_after_first_batch"] is None  # nothing after the first batch


def test_labelled_steps_are_not_references(tmp_path):
    with store_writer(tmp_path / "store", flush_every_tasks=8) as writer:
        for t in range(2):
            (traj, steps), = task_group(f"synthetic.label-{t}", 0, fail_first=False, viewport=VIEWPORT, variant=t)
            steps = [dataclasses.replace(s, label="detour" if s.step == 1 else "wrong_element" if s.step == 0 else None)
                     for s in steps]
            writer.add_group([(traj, steps)])
    view = SFTView(tmp_path / "store")
    config = _config()
    builder = PromptBuilder(prompt_config_from(config))
    policy = KnownPolicy(view, builder, [K] * len(view), [0] * len(view))
    settings = ReplaySettings.from_config(config.mine)
    assert settings.skip_labels == ("*",)  # the default: every labelled step (a teacher mistake) is no reference
    result = replay(view, range(len(view)), None, builder, settings, progress=False, sample=policy)
    assert result.skipped == {"detour": 2, "wrong_element": 2}
    assert [view[s.index].step.step for s in result.states] == [2, 2]
    assert [s.teacher_label for s in result.states] == [None, None]
    detours = replay(view, range(len(view)), None, builder, dataclasses.replace(settings, skip_labels=("detour",)),
                     progress=False, sample=policy)
    assert detours.skipped == {"detour": 2} and [s.teacher_label for s in detours.states] == ["wrong_element", None] * 2
    none = replay(view, range(len(view)), None, builder, dataclasses.replace(settings, skip_labels=()),
                  progress=False, sample=policy)
    assert len(none.states) == 6 and none.skipped == {}


def test_a_turn_cut_by_the_token_limit_is_wrong_in_mining_and_in_the_rewards(view):
    from configs.common import base_config
    from rmsweb_jax.salvage.rewards import RewardSettings, score_samples as reward_scores
    config = _config()
    builder = PromptBuilder(prompt_config_from(config))
    ex = view[0]
    cut = ex.target_text.split(CLOSE)[0]  # the right tool call, cut before </tool_call>
    assert CLOSE not in cut and parse_action(cut, RELATIVE).ok  # the parser alone accepts it
    settings = ReplaySettings.from_config(config.mine)
    policy = KnownPolicy(view, builder, [K] * len(view), [0] * len(view), finish_reason="length")
    policy.turns = {key: [cut] * K for key in policy.turns}
    (state,) = replay(view, [0], None, builder, settings, progress=False, sample=policy).states
    assert state.accuracy == 0.0 and state.failure_mode == "invalid_format"
    observation = ex.step.observation()
    (score,) = reward_scores([cut], ex.step.action, observation, RewardSettings.from_config(base_config().salvage),
                             finish_reasons=["length"])
    assert (score.correct, score.reward, score.category) == (False, -1.0, "truncated")
    assert reward_scores([cut], ex.step.action, observation, RewardSettings.from_config(base_config().salvage),
                         finish_reasons=["stop"])[0].correct  # a turn a stop sequence ended keeps counting
    policy.finish_reason = "stop"
    (state,) = replay(view, [0], None, builder, settings, progress=False, sample=policy).states
    assert state.accuracy == 1.0


def test_classify_and_settings_errors():
    assert classify([None, None, "wrong_text", None], 0.75) == (0.75, "routine")
    assert classify([None, "wrong_text", "wrong_text", "invalid_format"], 0.5) == (0.25, "wrong_text")
    with pytest.raises(ValueError, match="at least one scored sample"):
        classify([], 0.5)
    mine = _config().mine
    for key, value, message in (("samples", 0, "config.mine.samples must be >= 1"),
                                ("temperature", 0.0, "config.mine.temperature must be > 0"),
                                ("tau", 0.0, "config.mine.tau must be in \\(0, 1\\]")):
        bad = mine.copy_and_resolve_references()
        bad[key] = value
        with pytest.raises(ValueError, match=message):
            ReplaySettings.from_config(bad)


@pytest.mark.slow
def test_sampling_and_reference_logprobs_on_a_random_model(view, tmp_path):
    from rmsweb_jax.data.sft import encode_example
    from rmsweb_jax.sampling.chat_model import ChatModel
    from rmsweb_jax.sampling.sampler import SamplingParams
    config = _config()
    config.model.init = "random:demo"
    config.prompt.observation, config.prompt.system = "elements", "compact"  # short, text-only prompts
    config.prompt.history_images = 0
    builder = PromptBuilder(prompt_config_from(config))
    chat_model = ChatModel.load("random:demo", tmp_path, config=config, max_batch=4)
    examples = [view[0], view[1]]
    params = SamplingParams(max_new_tokens=6, temperature=1.0)
    turns = sample_turns(chat_model, [builder.messages(ex.context()) for ex in examples], 2, params, seed=0)
    assert [len(t) for t in turns] == [2, 2] and all(isinstance(text, str) and reason in ("stop", "length")
                                                     for t in turns for text, reason in t)
    assert turns != sample_turns(chat_model, [builder.messages(ex.context()) for ex in examples], 2, params, seed=1)

    got = ReferenceLogprobs(chat_model, builder)(examples)
    for ex, value in zip(examples, got):
        enc = encode_example(chat_model.tokenizer, builder, chat_model.image_config, ex, mask="action_only")
        ids = enc["input_ids"][None]
        logits = np.asarray(chat_model.model(ids, attention_mask=np.ones_like(ids)).logits[0], np.float64)
        top = logits.max(-1, keepdims=True)
        logp = logits - top - np.log(np.exp(logits - top).sum(-1, keepdims=True))
        per_token = logp[np.arange(len(ids[0]) - 1), ids[0, 1:]]
        want = float((per_token * enc["loss_mask"][1:]).sum())
        assert enc["loss_mask"].sum() > 5 and value == pytest.approx(want, rel=1e-4), ex.request_id

    settings = dataclasses.replace(ReplaySettings.from_config(config.mine), samples=2, max_new_tokens=6,
                                   reference_logprob=True, batch_states=2)
    result = replay(view, [0, 1], chat_model, builder, settings, progress=False)
    assert [s.reference_logprob for s in result.states] == pytest.approx(got, rel=1e-5)
    assert all(s.accuracy in (0.0, 0.5, 1.0) and len(s.samples) == 2 for s in result.states)
