"""The retry loop driving our own model in-process (FlaxPolicy over the tiny random checkpoint):
its unparseable turns run as waits and are stored with their errors and token counts, and its
reflections (written by the model) reach the next attempt."""
import pytest

from rmsweb_jax.sampling.chat_model import ChatModel
from rmsweb_jax.agents.flax_policy import FlaxPolicy
from configs.common import base_config
from rmsweb_jax.agents.prompt import PromptBuilder, prompt_config_from
from rmsweb_jax.collect.retries import RetryCollector
from rmsweb_jax.collect.store import TrajectoryStore
from rmsweb_jax.judges.programmatic import ProgrammaticJudge
from rmsweb_jax.sampling.sampler import SamplingParams
from rmsweb_jax.suites.miniwob import MiniWoBSuite
from rmsweb_jax.suites.task import Task
from tests.settings import collect_settings, store_writer

pytestmark = [pytest.mark.slow, pytest.mark.browser]

MAX_NEW_TOKENS = 8


def test_collect_with_the_tiny_flax_model(tmp_path):
    chat_model = ChatModel.load("random:tiny", tmp_path, max_batch=1)
    policy = FlaxPolicy(chat_model, PromptBuilder(prompt_config_from(base_config())), SamplingParams(max_new_tokens=MAX_NEW_TOKENS), owns_model=True)
    task = Task(suite="miniwob", id="miniwob.click-button", start_url="miniwob/click-button.html", site="miniwob")
    with MiniWoBSuite() as suite, store_writer(tmp_path / "store") as store:
        collector = RetryCollector(suite, policy, ProgrammaticJudge(success="solved"), store,
                                   collect_settings(attempts=2, workers=1, max_steps=2,
                                   progress=False))
        summary = collector.run([task], seeds=[0])
    policy.close()
    reader = TrajectoryStore(tmp_path / "store")
    trajectories = sorted(reader.trajectories(), key=lambda t: (t.seed, t.attempt))
    # A random model solves nothing: both attempts run, each cut at max_steps.
    assert [(t.seed, t.attempt) for t in trajectories] == [(0, 1), (0, 2)]
    for t in trajectories:
        assert t.policy == policy.name and t.num_steps == 2 and t.truncated
        assert t.verdict.outcome == "failure"  # cut off unfinished: a failure, not a judge error
        steps = reader.steps(t)
        for s in steps:
            assert s.prompt_tokens > 100 and 1 <= s.completion_tokens <= MAX_NEW_TOKENS
            if s.parse_error is not None:
                assert s.action.name == "wait" and s.action.seconds == 0.0
        assert t.parse_errors == sum(s.parse_error is not None for s in steps)
        assert t.prompt_tokens == sum(s.prompt_tokens for s in steps)
    assert [len(t.reflections) for t in trajectories] == [0, 1]
    assert all(isinstance(t.reflections[0], str) for t in trajectories if t.attempt == 2)
    stats = policy.stats()
    assert stats["reflections"] == summary.bridge["reflect_calls"] == 1
    assert stats["steps"] == summary.bridge["contexts"] == 4
