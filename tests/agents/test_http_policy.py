"""HttpPolicy against the real ChatServer (tiny random model) on 127.0.0.1, in a real browser."""
import dataclasses
import io

import numpy as np
import pytest
from PIL import Image

from rmsweb_jax.agents.chat_client import ChatClient, ChatError
from rmsweb_jax.agents.http_policy import HttpPolicy
from rmsweb_jax.agents.policy import PastStep, ReflectionRequest, StepContext
from configs.common import base_config
from rmsweb_jax.agents.prompt import PromptBuilder, prompt_config_from
from rmsweb_jax.sampling.serve import ChatServer
from rmsweb_jax.suites.miniwob import MiniWoBSuite, load_miniwob_tasks
from rmsweb_jax.web.action_text import format_action
from rmsweb_jax.web.actions import Action
from rmsweb_jax.web.episode import EpisodeRequest, History
from rmsweb_jax.web.observation import Observation
from rmsweb_jax.web.sync_pool import WorkerPool
from tests.sampling.tiny_chat import tiny_chat_model
from tests.settings import serve_settings

KEY = "policy-key"
MAX_TOKENS = 6  # one decode length for every test here: one compiled shape per prompt bucket
# Only the current screenshot: every step's prompt then falls in the same length bucket.
BUILDER = PromptBuilder(dataclasses.replace(prompt_config_from(base_config()), history_steps=4, history_images=0))


@pytest.fixture(scope="module")
def server():
    with ChatServer(tiny_chat_model(), serve_settings(api_key=KEY, max_body_bytes=4 << 20)) as server:
        yield server


def make_policy(server, **kw) -> HttpPolicy:
    client = ChatClient(server.base_url, server.model_name, api_key=KEY, backoff_s=0.01, max_concurrency=4)
    return HttpPolicy(client, BUILDER, max_tokens=MAX_TOKENS, **kw)


def png(width: int, height: int, *, noise: bool = False) -> bytes:
    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 256, (height, width, 3), np.uint8) if noise else np.full((height, width, 3), 230, np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    return buf.getvalue()


def observation(screenshot: bytes, size=(500, 240)) -> Observation:
    return Observation(url="http://127.0.0.1/task.html", title="task", screenshot=screenshot, viewport=size,
                       screenshot_size=size, elements=(), focused_id=None, instruction="Click the OK button.")


@pytest.mark.browser
def test_an_episode_runs_through_the_server_once_per_step(server):
    task = {t.id: t for t in load_miniwob_tasks()}["miniwob.click-button"]
    policy = make_policy(server)
    outputs = []  # (PolicyOutput, Action taken) per step, oldest first

    def act(history: History) -> Action:
        past = tuple(PastStep(screenshot=obs.screenshot, url=obs.url, thought=out.thought,
                              action_text=format_action(taken))
                     for obs, (out, taken) in zip(history.observations, outputs))
        ctx = StepContext(task_id=task.id, instruction=history.instruction, observation=history.observation,
                          history=past, step=len(history.actions), key=f"{history.request.request_id}/{len(past)}")
        [out] = policy.act([ctx])
        # A random model rarely writes a valid tool call: an unparseable turn becomes a harmless wait.
        taken = out.action if out.action is not None else Action("wait", seconds=0.0)
        outputs.append((out, taken))
        return taken

    before = server.stats()
    with MiniWoBSuite() as suite, WorkerPool(suite, workers=1) as pool:
        [episode] = list(pool.run([EpisodeRequest(task, seed=0, max_steps=3)], act))
    assert episode.complete and len(episode.actions) == 3, episode.faults
    assert episode.truncated and episode.reason == "step limit" and not episode.success
    assert len(episode.observations) == 4 and episode.instruction.startswith("Click on the")
    after = server.stats()
    assert after["completions"] - before["completions"] == 3  # the server answered once per step
    assert after["complete_calls"] - before["complete_calls"] == 3
    stats = policy.stats()
    assert stats["calls"] == 3 and stats["steps"] == 3 and stats["errors"] == 0
    assert stats["http_requests"] == 3 and stats["http_retries"] == 0
    assert stats["completion_tokens"] == sum(o.completion_tokens for o, _ in outputs)
    assert stats["prompt_tokens"] == sum(o.prompt_tokens for o, _ in outputs) > 3 * 128  # a screenshot each
    assert stats["parse_errors"] == sum(o.action is None for o, _ in outputs)
    # Each step's prompt carried the earlier steps: it grew.
    assert outputs[0][0].prompt_tokens < outputs[1][0].prompt_tokens < outputs[2][0].prompt_tokens
    policy.close()


def test_one_failed_request_does_not_fail_the_batch(server):
    # A second server over the same model with a small body limit: the noisy screenshot (large PNG)
    # of one context is refused with a 413, the plain ones go through (one at a time: max_batch=1
    # reuses the episode test's compiled batch shape).
    with ChatServer(server.chat_model, serve_settings(api_key=KEY, max_body_bytes=200_000, max_batch=1)) as small:
        policy = make_policy(small)
        contexts = [StepContext(task_id=f"t{i}", instruction="Click the OK button.", key=f"t{i}/0",
                                observation=observation(png(500, 240, noise=i == 1))) for i in range(3)]
        outputs = policy.act(contexts)
        assert [o.error is not None and "HTTP 413" in o.error for o in outputs] == [False, True, False]
        bad = outputs[1]
        assert bad.action is None and bad.text == "" and "exceeds the limit" in bad.error
        for o in outputs[::2]:
            assert o.prompt_tokens > 128 and 1 <= o.completion_tokens <= MAX_TOKENS
            assert (o.action is None) == (o.error is not None)  # unparseable text: a parse error, recorded
        stats = policy.stats()
        assert stats["errors"] == 1 and "413" in policy.last_errors[-1]
        assert stats["calls"] == 1 and stats["steps"] == 3 and stats["http_failures"] == 1
        assert small.stats()["completions"] == 2
        policy.close()


def test_reflect_goes_through_the_server(server):
    policy = make_policy(server)
    shot = png(500, 240)
    request = ReflectionRequest(task_id="t", instruction="Click the OK button.", attempt=1, verdict="NOT SUCCESS",
                                verdict_reason="clicked Cancel",
                                steps=(PastStep(shot, "http://127.0.0.1/task.html", "click it",
                                                format_action(Action.click(500, 500))),))
    before = server.stats()["completions"]
    text = policy.reflect(request)
    assert isinstance(text, str) and text == text.strip()
    assert server.stats()["completions"] == before + 1
    stats = policy.stats()
    assert stats["reflections"] == 1 and stats["calls"] == 0 and stats["prompt_tokens"] > 128
    policy.close()
    # A failing endpoint: reflect raises (one call, nothing to fall back on), and the error is counted.
    broken = HttpPolicy(ChatClient(server.base_url, server.model_name, api_key="wrong"), BUILDER)
    with pytest.raises(ChatError, match="HTTP 401"):
        broken.reflect(request)
    assert broken.stats()["errors"] == 1
