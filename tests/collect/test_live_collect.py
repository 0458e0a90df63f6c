"""The collect stage on a live suite, as users run it against real sites, here on a tiny shop
served on 127.0.0.1: WebVoyager-format tasks read by our loader, the policy and the official
WebVoyager judge over OpenAI-compatible endpoints, reflections between attempts.

The external models (the agent's VLM, the judge's VLM) are a stdlib HTTP server in this file
(ScriptedLLM): it answers agent prompts with a fixed plan of tool calls chosen from the page URL
(a careless plan without a reflection in the prompt, the careful one with it), judge prompts
by reading the answer the judge was shown, and reflection prompts with a fixed reflection. It
stands in for the models, not for any of our code: prompts, parsing, browsing, judging,
retries, the store and the report are all the real thing.
"""
import http.server
import json
import re
import threading

import pytest

from configs.common import base_config
from rmsweb_jax.agents.chat_client import ChatClient
from rmsweb_jax.agents.http_policy import HttpPolicy
from rmsweb_jax.agents.prompt import PromptBuilder, prompt_config_from
from rmsweb_jax.collect.retries import RetryCollector
from rmsweb_jax.collect.store import TrajectoryStore
from rmsweb_jax.judges.from_config import judge_from_config, judge_spec
from rmsweb_jax.judges.llm import image_bytes
from rmsweb_jax.stages import collect as stage
from rmsweb_jax.suites import load_online_mind2web, load_webtailbench, load_webvoyager
from rmsweb_jax.suites.download import DEFAULT_TASK_FILES
from rmsweb_jax.suites.from_config import live_tasks
from rmsweb_jax.suites.http_server import LocalHTTPServer
from rmsweb_jax.suites.live import LiveSuite
from rmsweb_jax.suites.task import Task
from tests import benchmark_fixtures as fx
from tests.settings import collect_settings, store_writer

ASK = "Find the price of the Blue Widget in the Widget Shop and answer with it."
REFLECTION = ("Step 2 went wrong: you answered from the search results without opening the product. Next time "
              "open the Blue Widget result and read the price on its page.")
JUDGE_SCREENSHOTS = 2

PAGES = {
    "index.html": """<!doctype html><html><head><title>Widget Shop</title></head>
<body style="margin:0;font-family:sans-serif">
<form action="results.html" method="get">
<input name="q" aria-label="Search the shop" placeholder="Search the shop"
       style="position:absolute;left:5%;top:10%;width:90%;height:30%;font-size:32px">
</form></body></html>""",
    "results.html": """<!doctype html><html><head><title>Search results</title></head>
<body style="margin:0;font-family:sans-serif">
<p id="q" style="position:absolute;left:5%;top:2%;font-size:24px"></p>
<a href="item.html" style="display:block;position:absolute;left:5%;top:40%;width:90%;height:40%;font-size:32px;
   background:#dde">Blue Widget (from $40)</a>
<script>document.getElementById('q').textContent = 'Results for: ' +
  new URLSearchParams(location.search).get('q');</script>
</body></html>""",
    "item.html": """<!doctype html><html><head><title>Blue Widget</title></head>
<body style="font-family:sans-serif"><h1>Blue Widget</h1><p style="font-size:40px">Price: $42</p></body></html>""",
}


def _call(thought, arguments):
    return f'{thought}\n<tool_call>\n{json.dumps({"name": "computer_use", "arguments": arguments})}\n</tool_call>'


def _text(message):
    content = message["content"]
    return content if isinstance(content, str) else "".join(p["text"] for p in content if p["type"] == "text")


class ScriptedLLM:
    """An OpenAI-compatible chat-completions endpoint on 127.0.0.1 standing in for the external
    agent and judge models (see the module docstring). Every request is kept in `requests` as
    (kind, messages); `judge_reply` overrides the judge's answer."""

    def __init__(self, judge_reply=None):
        self.requests, self.judge_reply = [], judge_reply
        self._lock = threading.Lock()
        llm = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                text = llm.reply(body["messages"])
                data = json.dumps({"object": "chat.completion", "model": body["model"],
                                   "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                                                "finish_reason": "stop"}],
                                   "usage": {"prompt_tokens": 100, "completion_tokens": 10}}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.base_url = f"http://127.0.0.1:{self._server.server_address[1]}/v1"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def of(self, kind):
        """Returns the messages of every request of `kind` ("agent", "judge", "reflect"), in order."""
        with self._lock:
            return [m for k, m in self.requests if k == kind]

    def reply(self, messages):
        system = _text(messages[0])
        user = _text(messages[-1])
        kind = ("agent" if system.startswith("You are a web agent") else
                "reflect" if system.startswith("You review a web agent's failed attempt") else
                "judge" if system.startswith("As an evaluator") else "unknown")
        with self._lock:
            self.requests.append((kind, messages))
        if kind == "reflect":
            return REFLECTION
        if kind == "judge":
            if self.judge_reply is not None:
                return self.judge_reply
            answer = re.search(r"Result Response: (.*)\n", user).group(1)
            return ("The screenshots show the product page with its price, matching the response. SUCCESS"
                    if "$42" in answer else "The response does not match the product page. NOT SUCCESS")
        if kind != "agent":
            return "I do not know this prompt."
        url = re.search(r"Current page: (\S+)", user).group(1)
        careful = "open the Blue Widget result" in user  # the reflection is in the prompt
        if "index.html" in url:
            return _call("I search the shop for the widget.",
                         {"action": "type", "coordinate": [500, 250], "text": "blue widget", "press_enter": True})
        if "results.html" in url and not careful:
            return _call("The result says from $40; that is the price.", {"action": "answer", "text": "$40"})
        if "results.html" in url:
            return _call("I open the Blue Widget result.", {"action": "left_click", "coordinate": [500, 600]})
        return _call("The product page shows the price.", {"action": "answer", "text": "The Blue Widget costs $42."})

    def close(self):
        self._server.shutdown()
        self._server.server_close()


@pytest.fixture()
def shop(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    for name, html in PAGES.items():
        (site / name).write_text(html)
    with LocalHTTPServer(site) as server:
        yield server


@pytest.fixture()
def task_file(tmp_path, shop):
    """A WebVoyager-format task file: two shop tasks and one benchmark-style record (fixture)."""
    benchmark_record = fx.webvoyager_records()[0]
    records = [{"web_name": "Widget Shop", "id": "Widget Shop--0", "ques": "Find the shop's cheapest widget.",
                "web": shop.url("index.html")},
               {"web_name": "Widget Shop", "id": "Widget Shop--1", "ques": ASK, "web": shop.url("index.html")},
               benchmark_record]
    path = tmp_path / "shop_tasks.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def _config(task_file, llm_url, judge_url=None, **overrides):
    config = base_config()
    c = config.collect
    c.suite, c.task_list, c.tasks, c.num_seeds, c.attempts = "webvoyager", str(task_file), "Widget Shop--1", 1, 3
    c.workers, c.max_steps, c.viewport, c.progress, c.flush_every_tasks = 1, 6, (640, 400), False, 1
    c.policy = f"http:{llm_url}#scripted-agent"
    c.judge = f"{judge_url or llm_url}#scripted-judge"  # no judge name: the suite's official one
    c.judge_screenshots = JUDGE_SCREENSHOTS
    for key, value in overrides.items():
        setattr(c, key, value)
    return config


@pytest.mark.browser
def test_live_suite_retries_with_the_official_llm_judge(tmp_path, task_file):
    llm = ScriptedLLM()
    try:
        report = stage.run(_config(task_file, llm.base_url), tmp_path)
    finally:
        llm.close()

    # Attempt 1 answered from the results list ($40) and failed; the reflection made attempt 2
    # open the product and answer $42, which the judge accepted.
    assert report["tasks"] == 1 and report["trajectories"] == 2
    assert report["success_at_1"] == 0.0 and report["success_at_le_K"] == 1.0
    assert report["success_at_1"] < report["success_at_le_K"]
    assert report["judge"]["names"] == ["webvoyager"]
    assert report["judge"]["endpoint_calls"] == 2 and report["judge"]["errors"] == 0
    assert report["policy"]["reflections_written"] == 1 and report["run"]["judge_errors"] == 0

    store = TrajectoryStore(tmp_path / "store")
    first, second = sorted(store.trajectories(), key=lambda t: t.attempt)
    assert first.task["id"] == second.task["id"] == "Widget Shop--1" and first.task["suite"] == "webvoyager"
    assert first.instruction == ASK and first.reflections == () and second.reflections == (REFLECTION,)
    assert (first.verdict.outcome, second.verdict.outcome) == ("failure", "success")
    assert first.verdict.judge == second.verdict.judge == "webvoyager" and "NOT SUCCESS" in first.verdict.raw
    assert (first.final_answer, second.final_answer) == ("$40", "The Blue Widget costs $42.")
    steps = {t.attempt: store.steps(t) for t in (first, second)}
    assert [s.action.name for s in steps[1]] == ["type", "answer"]
    assert [s.action.name for s in steps[2]] == ["type", "left_click", "answer"]
    assert [s.url.rsplit("/", 1)[1].split("?")[0] for s in steps[2]] == ["index.html", "results.html", "item.html"]
    assert all(s.thought and s.action_text.startswith("<tool_call>") for ss in steps.values() for s in ss)

    # The judge saw the task, the answer and the last k screenshots of each attempt, oldest first.
    judged = llm.of("judge")
    assert len(judged) == 2
    for messages, trajectory in zip(judged, (first, second)):
        user = messages[-1]["content"]
        text = _text(messages[-1])
        assert f"TASK: {ASK}\nResult Response: {trajectory.final_answer}\n" in text
        shots = [image_bytes(p) for p in user if p["type"] == "image_url"]
        assert shots == [s.screenshot for s in steps[trajectory.attempt]][-JUDGE_SCREENSHOTS:]
        assert f"{len(shots)} screenshots at the end" in text
    # Attempt 2 had three steps: its first screenshot (the search page) is not among the last two.
    assert steps[2][0].screenshot not in [image_bytes(p) for p in judged[1][-1]["content"] if p["type"] == "image_url"]

    # The reflector was the policy's endpoint, shown the failed attempt and its verdict; only
    # attempt 2's agent prompts carried the reflection.
    reflect = llm.of("reflect")
    assert len(reflect) == 1
    assert ASK in _text(reflect[0][-1]) and "Judge's verdict: failure" in _text(reflect[0][-1])
    agent = llm.of("agent")
    assert len(agent) == len(steps[1]) + len(steps[2])
    assert [REFLECTION in _text(m[-1]) for m in agent] == [False] * len(steps[1]) + [True] * len(steps[2])


@pytest.mark.browser
@pytest.mark.parametrize("failure", ["endpoint down", "unreadable verdict"])
def test_a_judge_error_is_recorded_and_ends_the_group_unsolved(tmp_path, task_file, failure):
    llm = ScriptedLLM(judge_reply="The page looks plausible." if failure == "unreadable verdict" else None)
    dead = None
    if failure == "endpoint down":
        dead = ScriptedLLM()  # bind a port, then free it: nothing listens there any more
        dead.close()
    try:
        report = stage.run(_config(task_file, llm.base_url, dead.base_url if dead else None), tmp_path)
    finally:
        llm.close()
    (trajectory,) = TrajectoryStore(tmp_path / "store").trajectories()
    verdict = trajectory.verdict
    assert verdict.outcome == "error" and not trajectory.success and verdict.judge == "webvoyager"
    if failure == "endpoint down":
        assert "judge endpoint call failed" in verdict.reason and "connection" in verdict.reason.lower()
    else:
        assert "expected 'SUCCESS' or 'NOT SUCCESS'" in verdict.reason and verdict.raw == "The page looks plausible."
    # No reflection on an undecided attempt, no retry: the group ends unsolved, counted.
    assert llm.of("reflect") == [] and trajectory.attempt == 1 and trajectory.reflections == ()
    assert report["trajectories"] == 1 and report["success_at_le_K"] == 0.0
    assert report["judge"]["errors"] == 1 and report["run"]["judge_errors"] == 1


class RaisingJudge:
    """A judge with a bug: it raises instead of returning a Verdict."""

    name = "buggy"

    def judge(self, attempt):
        raise KeyError("rubric")


@pytest.mark.browser
def test_a_judge_that_raises_is_an_error_verdict_not_a_crash(tmp_path, shop):
    llm = ScriptedLLM()
    task = Task(suite="webvoyager", id="Widget Shop--1", start_url=shop.url("index.html"), instruction=ASK,
                allowed_hosts=("127.0.0.1",))
    policy = HttpPolicy(ChatClient(llm.base_url, "scripted-agent"), PromptBuilder(prompt_config_from(base_config())))
    try:
        with store_writer(tmp_path / "store") as store:
            summary = RetryCollector(LiveSuite(viewport=(640, 400)), policy, RaisingJudge(), store,
                                     collect_settings(attempts=3,
                                     workers=1, max_steps=6, progress=False)).run([task], seeds=[0])
    finally:
        policy.close()
        llm.close()
    (trajectory,) = TrajectoryStore(tmp_path / "store").trajectories()
    assert trajectory.verdict.outcome == "error" and trajectory.verdict.judge == "buggy"
    assert trajectory.verdict.reason == "judge raised KeyError: 'rubric'"
    assert summary.judge_errors == 1 and summary.solved == 0 and llm.of("reflect") == []


def test_live_suites_refuse_the_programmatic_judge_and_the_teacher(tmp_path, task_file):
    config = _config(task_file, "http://127.0.0.1:9/v1", judge="programmatic")
    with pytest.raises(ValueError, match=r"'programmatic' cannot judge the live webvoyager suite.*official one is "
                                         r"'webvoyager'"):
        stage.run(config, tmp_path)
    config.collect.judge = ""  # the official judge, but no endpoint to ask
    with pytest.raises(ValueError, match=r"'webvoyager' judge is an LLM judge and needs its endpoint"):
        stage.run(config, tmp_path)
    config.collect.judge, config.collect.policy = "http://127.0.0.1:9/v1#judge", "teacher"
    with pytest.raises(ValueError, match=r"'teacher' cannot play the webvoyager suite"):
        stage.run(config, tmp_path)
    assert not (tmp_path / "store").exists()


def test_official_judges_per_suite():
    config = base_config()
    c = config.collect
    for suite, official in (("webvoyager", "webvoyager"), ("online_mind2web", "webjudge"),
                            ("webtailbench", "webtailbench")):
        c.suite, c.judge = suite, "https://judge.example/v1#qwen3-vl-32b"
        assert judge_spec(c) == (official, "https://judge.example/v1#qwen3-vl-32b")
        c.judge = "webjudge:http://127.0.0.1:8001/v1#m"  # another LLM judge, named
        assert judge_spec(c) == ("webjudge", "http://127.0.0.1:8001/v1#m")
        assert judge_from_config(c).name == "webjudge"
    c.suite, c.judge = "miniwob", ""
    assert judge_spec(c) == ("programmatic", None)
    with pytest.raises(ValueError, match="takes no endpoint"):
        c.judge = "http://127.0.0.1:8001/v1#m"
        judge_spec(c)
    c.judge = "webvoyager:http://127.0.0.1:8001/v1#m"  # MiniWoB++ may be judged by an LLM when asked
    assert judge_spec(c) == ("webvoyager", "http://127.0.0.1:8001/v1#m")
    c.judge = "gpt-judge:http://x/v1#m"
    with pytest.raises(ValueError, match="unknown judge 'gpt-judge'"):
        judge_spec(c)


def test_live_task_selection_from_the_benchmark_files(tmp_path, benchmark_files, monkeypatch):
    bench = benchmark_files
    monkeypatch.setenv("RMSWEB_DATA", str(tmp_path / "no-data"))  # the default data dir: empty
    c = base_config().collect
    c.suite, c.task_list = "webvoyager", str(bench / "webvoyager" / "WebVoyager_data.jsonl")
    c.tasks, c.reference_answers = "Amazon--0, Allrecipes--3", str(bench / "webvoyager" / "reference_answer.json")
    tasks = live_tasks(c)
    assert [t.id for t in tasks] == ["Amazon--0", "Allrecipes--3"] and all(t.reference_answer for t in tasks)
    c.tasks, c.reference_answers, c.limit = "", "", 5
    assert [t.id for t in live_tasks(c)] == [f"Allrecipes--{i}" for i in range(5)]
    c.tasks = "Allrecipes--9999"
    with pytest.raises(ValueError, match=r"\['Allrecipes--9999'\] are not in .*WebVoyager_data.jsonl"):
        live_tasks(c)
    c.suite, c.tasks, c.limit = "online_mind2web", "", 3
    c.task_list = str(bench / "online_mind2web" / "fara_Online_Mind2Web_06042025.json")
    assert [t.suite for t in live_tasks(c)] == ["online_mind2web"] * 3
    c.suite, c.task_list = "webtailbench", str(bench / "webtailbench" / "stagehand_WebTailBench_data.jsonl")
    assert all(t.rubric for t in live_tasks(c))
    c.task_list = ""
    with pytest.raises(ValueError, match=r"collect.task_list is empty and the webtailbench task file is not in the "
                                         r"default data dir \(.*no-data/webtailbench/stagehand_WebTailBench_data"
                                         r"\.jsonl.*`python -m rmsweb_jax.suites.download --suite=webtailbench`"):
        live_tasks(c)
    # The rubric judge on a rubric-less edition fails before any browser starts.
    config = base_config()
    config.collect.suite, config.collect.judge, config.collect.policy = "webtailbench", "http://127.0.0.1:9/v1#j", \
        "http:http://127.0.0.1:9/v1#p"
    config.collect.task_list = str(bench / "webtailbench" / "molmoweb_webtailbench.json")
    with pytest.raises(ValueError, match="webtailbench needs each task's rubric"):
        stage.run(config, tmp_path)


def test_an_empty_task_list_reads_the_downloaded_file_of_the_default_data_dir(tmp_path, benchmark_files, monkeypatch):
    # The layout `python -m rmsweb_jax.suites.download --dest=DIR` writes; $RMSWEB_DATA points at it.
    data = tmp_path / "data"
    for name in DEFAULT_TASK_FILES.values():
        (data / name).parent.mkdir(parents=True, exist_ok=True)
        (data / name).write_bytes((benchmark_files / name).read_bytes())
    monkeypatch.setenv("RMSWEB_DATA", str(data))
    c = base_config().collect
    c.task_list, c.limit = "", 4
    loaders = {"webvoyager": load_webvoyager, "online_mind2web": load_online_mind2web,
               "webtailbench": load_webtailbench}
    for suite, load in loaders.items():
        c.suite = suite
        assert live_tasks(c) == load(data / DEFAULT_TASK_FILES[suite])[:4]
    c.task_list = str(tmp_path / "missing.jsonl")  # a named file is never replaced by the default
    with pytest.raises(ValueError, match=r"missing.jsonl'?: no such file .*--suite=webtailbench"):
        live_tasks(c)
