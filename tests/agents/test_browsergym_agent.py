"""Our policies inside BrowserGym (agents/browsergym_agent.py): the scripted teacher plays MiniWoB++ through
browsergym-miniwob, on our local MiniWoB++ pages and Debian's Chromium, with the same outcome as in our own
environment on the same problems (BrowserGym's seed s starts the page with Math.seedrandom of
RandomState(s).randint(0, 1000000); our suite starts it with Math.seedrandom of its seed)."""
import numpy as np
import pytest

pytest.importorskip("browsergym.core", reason="BrowserGym is not installed (setup.py's 'browsergym' extra: "
                    "pip install --no-deps -c constraints.txt browsergym-core browsergym-miniwob beautifulsoup4 "
                    "soupsieve pyparsing)")
pytest.importorskip("browsergym.miniwob", reason="browsergym-miniwob is not installed (setup.py's 'browsergym' extra)")

from rmsweb_jax.agents.browsergym_agent import (BrowserGymAgent, BrowserGymView, browsergym_action,  # noqa: E402
                                                browsergym_action_set, use_system_chromium)
from rmsweb_jax.agents.policy import PastStep, StepContext  # noqa: E402
from rmsweb_jax.agents.teacher import MistakeConfig, ScriptedTeacher  # noqa: E402
from rmsweb_jax.suites.miniwob import MiniWoBSuite, load_miniwob_tasks, miniwob_html_dir  # noqa: E402
from rmsweb_jax.suites.success_rule import is_solved  # noqa: E402
from rmsweb_jax.web.action_text import format_action  # noqa: E402
from rmsweb_jax.web.actions import Action  # noqa: E402
from rmsweb_jax.web.episode import EpisodeRequest  # noqa: E402
from rmsweb_jax.web.observation import Observation  # noqa: E402
from rmsweb_jax.web.sync_pool import WorkerPool  # noqa: E402

TASKS = ("miniwob.click-button", "miniwob.click-checkboxes", "miniwob.enter-text", "miniwob.click-link")
SEEDS = (0, 1)
# Wrong clicks on some steps (drawn from the episode's key, the same in both environments), so that some episodes
# fail and "the same outcome" is not "every one solved".
MISTAKES = MistakeConfig(wrong_element_p=0.3, seed=3)
MAX_STEPS = 8


def page_seed(seed: int) -> int:
    """Returns the Math.seedrandom seed browsergym-miniwob starts the page with for env.reset(seed=seed)."""
    return int(np.random.RandomState(seed).randint(0, 1000000))


def test_our_actions_become_browsergym_code_its_parser_accepts():
    obs = Observation(url="http://127.0.0.1/x.html", title="", screenshot=b"", viewport=(332, 214),
                      screenshot_size=(498, 321), elements=(), focused_id=None, instruction="x")
    view = BrowserGymView(obs, zoom=1.5)
    cases = {
        Action.click(500, 500): "mouse_click(249.0, 160.5)",  # the 0-1000 grid -> screenshot pixels
        Action("double_click", coordinate=(0, 1000)): "mouse_dblclick(0.0, 319.5)",  # clamped inside the page
        Action("hover", coordinate=(250, 250)): "mouse_move(124.5, 80.25)",
        Action.type_text("it's", press_enter=True, clear=True, coordinate=(500, 500)):
            "mouse_click(249.0, 160.5)\nkeyboard_press('Control+a')\nkeyboard_press('Backspace')\n"
            'keyboard_type("it\'s")\nkeyboard_press(\'Enter\')',
        Action("key", keys=("ctrl", "a")): "keyboard_press('Control+a')",
        Action("scroll", direction="down", amount=100): "scroll_at(249.0, 160.5, 0, 150.0)",
        Action("go_back"): "go_back()",
        Action("navigate", url="example.com"): "goto('https://example.com')",
        Action("wait", seconds=0.5): "noop(500)",
        Action.answer_with("done"): "send_msg_to_user('done')",
    }
    action_set = browsergym_action_set()
    for action, code in cases.items():
        assert browsergym_action(action, view) == code, action
        action_set.to_python_code(code)  # raises on code BrowserGym's parser refuses


def our_episodes(teacher, cases):
    """Returns {(task, seed): Episode} of our MiniWoBSuite on BrowserGym's page seeds."""
    tasks = {t.id: t for t in load_miniwob_tasks()}

    def policy(history):
        rid, step = history.request.request_id, len(history.actions)
        past = tuple(PastStep(o.screenshot, o.url, thoughts[(rid, i)], format_action(a))
                     for i, (o, a) in enumerate(zip(history.observations, history.actions)))
        out = teacher.act([StepContext(task_id=history.request.task.id, instruction=history.instruction,
                                       observation=history.observation, history=past, step=step,
                                       key=f"{rid}/{step}")])[0]
        thoughts[(rid, step)] = out.thought
        return out.action

    thoughts = {}
    requests = {key(task, seed): EpisodeRequest(tasks[task], seed=page_seed(seed), max_steps=MAX_STEPS,
                                                request_id=key(task, seed)) for task, seed in cases}
    case_of = {key(task, seed): (task, seed) for task, seed in cases}
    with MiniWoBSuite() as suite, WorkerPool(suite, workers=1) as pool:
        return {case_of[e.request.request_id]: e for e in pool.run(requests.values(), policy)}


def key(task: str, seed: int) -> str:
    return f"{task}#{page_seed(seed)}@1"


def browsergym_episodes(teacher, cases, monkeypatch):
    """Returns {(task, seed): (instruction, solved, steps)} of the same teacher through BrowserGymAgent in
    browsergym-miniwob, served from our MiniWoB++ pages."""
    import gymnasium as gym
    import browsergym.miniwob  # noqa: F401 (registers the browsergym/miniwob.* environments)
    results = {}
    with MiniWoBSuite() as suite:  # its HTTP server serves the package's html/ folder
        monkeypatch.setenv("MINIWOB_URL", suite.base_url + "miniwob/")
        driver = use_system_chromium()
        try:
            for task, seed in cases:
                agent = BrowserGymAgent(teacher, task_id=task, episode_id=key(task, seed))
                env = gym.make(f"browsergym/{task}", action_mapping=agent.action_set.to_python_code)
                try:
                    obs, info = env.reset(seed=seed)
                    instruction, steps = obs["goal"], 0
                    while steps < MAX_STEPS:
                        action, _ = agent.get_action(agent.obs_preprocessor(obs))
                        if action is None:
                            break
                        obs, reward, terminated, truncated, info = env.step(action)
                        steps += 1
                        assert not obs["last_action_error"], (task, seed, action, obs["last_action_error"])
                        if terminated or truncated:
                            break
                    task_info = info["task_info"]
                    results[(task, seed)] = (instruction, task_info["DONE_GLOBAL"] is True
                                             and is_solved(float(task_info["RAW_REWARD_GLOBAL"])), steps)
                finally:
                    env.close()
        finally:
            driver.stop()
    return results


@pytest.mark.browser
@pytest.mark.slow
def test_the_teacher_through_browsergym_scores_as_in_our_environment(monkeypatch):
    try:
        miniwob_html_dir()
    except (ImportError, FileNotFoundError) as e:
        pytest.skip(f"no MiniWoB++ pages to serve: {e}")
    cases = [(task, seed) for task in TASKS for seed in SEEDS]
    ours = our_episodes(ScriptedTeacher(MISTAKES), cases)
    theirs = browsergym_episodes(ScriptedTeacher(MISTAKES), cases, monkeypatch)
    # The same problem (BrowserGym's seed -> our page seed), the same outcome, the same number of steps.
    assert {c: theirs[c][0] for c in cases} == {c: ours[c].instruction for c in cases}
    assert {c: theirs[c][1] for c in cases} == {c: bool(ours[c].success) for c in cases}
    assert {c: theirs[c][2] for c in cases} == {c: len(ours[c].actions) for c in cases}
    outcomes = {theirs[c][1] for c in cases}
    assert outcomes == {True, False}, theirs  # the mistakes make some fail: agreement is not "all solved"


@pytest.mark.browser
@pytest.mark.slow
def test_a_model_policy_and_its_server_play_through_browsergym(monkeypatch):
    """FlaxPolicy (in process) and HttpPolicy (our server) over the tiny random model: each BrowserGym step asks the
    model once with our prompt of BrowserGym's page (screenshot and earlier steps), and its turn becomes BrowserGym
    code (a random model rarely writes a valid tool call: such a turn is played as noop(0))."""
    import dataclasses

    import gymnasium as gym
    import browsergym.miniwob  # noqa: F401 (registers the browsergym/miniwob.* environments)
    from configs.common import base_config
    from rmsweb_jax.agents.chat_client import ChatClient
    from rmsweb_jax.agents.flax_policy import FlaxPolicy
    from rmsweb_jax.agents.http_policy import HttpPolicy
    from rmsweb_jax.agents.prompt import PromptBuilder, prompt_config_from
    from rmsweb_jax.sampling.sampler import SamplingParams
    from rmsweb_jax.sampling.serve import ChatServer
    from tests.sampling.tiny_chat import tiny_chat_model
    from tests.settings import serve_settings

    try:
        miniwob_html_dir()
    except (ImportError, FileNotFoundError) as e:
        pytest.skip(f"no MiniWoB++ pages to serve: {e}")
    steps = 2
    # Only the current screenshot: both steps' prompts fall in one length bucket (one compiled shape).
    builder = PromptBuilder(dataclasses.replace(prompt_config_from(base_config()), history_steps=4, history_images=0))
    with MiniWoBSuite() as suite, ChatServer(tiny_chat_model(), serve_settings(api_key="k")) as server:
        monkeypatch.setenv("MINIWOB_URL", suite.base_url + "miniwob/")
        policies = {
            "flax": FlaxPolicy(tiny_chat_model(), builder, SamplingParams(max_new_tokens=6)),
            "http": HttpPolicy(ChatClient(server.base_url, server.model_name, api_key="k"), builder, max_tokens=6),
        }
        driver = use_system_chromium()
        env = gym.make("browsergym/miniwob.click-button", action_mapping=browsergym_action_set().to_python_code)
        try:
            for name, policy in policies.items():
                agent = BrowserGymAgent(policy, task_id="miniwob.click-button", episode_id=f"{name}@1")
                served = server.stats()["completions"]
                obs, _ = env.reset(seed=0)
                for _ in range(steps):
                    code, info = agent.get_action(agent.obs_preprocessor(obs))
                    output = agent.outputs[-1]
                    assert info["extra_info"]["text"] == output.text and output.prompt_tokens > 0, (name, output)
                    assert code == ("noop(0)" if output.action is None else
                                    browsergym_action(output.action, agent.last_view))
                    obs, _, terminated, truncated, _ = env.step(code)
                    assert not obs["last_action_error"], (name, code, obs["last_action_error"])
                    if terminated or truncated or agent.finished:
                        break
                assert policy.stats()["steps"] == len(agent.outputs) >= 1, name
                assert server.stats()["completions"] - served == (len(agent.outputs) if name == "http" else 0)
        finally:
            env.close()
            driver.stop()
            for policy in policies.values():
                policy.close()
