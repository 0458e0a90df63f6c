"""MiniWoB++ on real Chromium: every task loads, seeds reproduce, scripted solutions score."""
import collections
import csv

import pytest

from miniwob_solvers import PLANNERS, plan, solving_policy, wrong_click
from rmsweb_jax.suites.miniwob import TASK_TABLE, MiniWoBSuite, load_miniwob_tasks, miniwob_html_dir
from rmsweb_jax.suites.task_files import TaskFileError
from rmsweb_jax.web.actions import Action
from rmsweb_jax.web.episode import EpisodeRequest
from rmsweb_jax.web.sync_pool import WorkerPool
from rmsweb_jax.web.worker import BrowserWorker


def test_task_list_matches_the_csv(miniwob_tasks):
    assert len(miniwob_tasks) == 125
    splits = collections.Counter(t.split for t in miniwob_tasks.values())
    assert splits == {"test": 63, "train": 62}
    assert collections.Counter(t.category for t in miniwob_tasks.values())["original"] == 77
    task = miniwob_tasks["miniwob.click-button"]
    assert task.start_url == "miniwob/click-button.html" and task.split == "test"
    assert task.metadata == {"webgum_subset": True, "similarity_group": 7, "delay": False}
    assert all((miniwob_html_dir() / t.start_url).is_file() for t in miniwob_tasks.values())


def test_packaged_table_is_the_benchmark_csv(benchmarks_dir):
    # Our table holds the facts of BrowserGym's metadata file: same rows, same columns.
    if not (benchmarks_dir / "miniwob_tasks.csv").is_file():  # not among the downloadable files
        pytest.skip(f"miniwob_tasks.csv (BrowserGym's metadata) not in RMSWEB_BENCHMARKS={benchmarks_dir}")
    with open(TASK_TABLE, newline="") as ours, open(benchmarks_dir / "miniwob_tasks.csv", newline="") as real:
        assert list(csv.reader(ours)) == list(csv.reader(real))
    assert load_miniwob_tasks() == load_miniwob_tasks(benchmarks_dir / "miniwob_tasks.csv")


def test_malformed_csv_rows_name_file_and_line(tmp_path):
    rows = list(csv.reader(open(TASK_TABLE, newline="")))
    cases = {
        "no-such-task": (["miniwob.no-such-task"] + rows[1][1:], "no page"),
        "bad-split": (rows[2][:5] + ["validation"], "browsergym_split"),
        "bad-name": (["click-button"] + rows[3][1:], "task_name"),
    }
    for label, (bad_row, message) in cases.items():
        path = tmp_path / f"{label}.csv"
        with open(path, "w", newline="") as f:
            csv.writer(f).writerows([rows[0], rows[1], bad_row])
        with pytest.raises(TaskFileError, match=rf"{label}\.csv:3: .*{message}"):
            load_miniwob_tasks(path)
    path = tmp_path / "columns.csv"
    path.write_text("task_name,split\nminiwob.click-button,test\n")
    with pytest.raises(TaskFileError, match=r"columns\.csv:1: missing columns"):
        load_miniwob_tasks(path)


@pytest.mark.browser
@pytest.mark.slow
def test_every_task_loads_and_reports_its_utterance(loop, miniwob_worker, miniwob_tasks):
    problems = {}
    for task in miniwob_tasks.values():
        try:
            obs = loop.run(miniwob_worker.reset(task, seed=0), 60)
        except Exception as e:  # noqa: BLE001 — collect every failure, report them together
            problems[task.id] = repr(e)
            continue
        if not obs.instruction.strip():
            problems[task.id] = "empty utterance"
        elif obs.screenshot_size != (500, 240) or not obs.url.endswith(task.start_url):
            problems[task.id] = f"bad observation {obs.screenshot_size} {obs.url}"
    assert not problems, problems
    assert miniwob_worker.restarts == 0


@pytest.mark.browser
def test_same_seed_same_utterance(loop, miniwob_worker, miniwob_tasks):
    for name in ("miniwob.click-button", "miniwob.enter-text", "miniwob.click-checkboxes", "miniwob.email-inbox",
                 "miniwob.book-flight"):
        task = miniwob_tasks[name]
        first = [loop.run(miniwob_worker.reset(task, seed=s)) for s in range(4)]
        # Another task in between, so the page is loaded afresh.
        loop.run(miniwob_worker.reset(miniwob_tasks["miniwob.focus-text"], seed=0))
        again = [loop.run(miniwob_worker.reset(task, seed=s)) for s in range(4)]
        assert [o.instruction for o in first] == [o.instruction for o in again], name
        assert [[(e.role, e.name) for e in o.elements] for o in first] == \
               [[(e.role, e.name) for e in o.elements] for o in again], name
        assert len({o.instruction for o in first}) > 1, f"{name}: seeds 0-3 all gave {first[0].instruction!r}"


@pytest.mark.browser
def test_correct_actions_get_reward_1(miniwob_suite, miniwob_tasks):
    requests = [EpisodeRequest(miniwob_tasks[name], seed=seed, max_steps=8) for name in PLANNERS for seed in (1, 2)]
    with WorkerPool(miniwob_suite, workers=2) as pool:
        episodes = list(pool.run(requests, solving_policy))
    assert sorted(e.request.request_id for e in episodes) == sorted(r.request_id for r in requests)
    failed = {e.request.request_id: (e.reward, e.reason, e.instruction) for e in episodes if e.reward != 1.0}
    assert not failed
    for e in episodes:
        assert e.complete and e.done and e.success and not e.truncated and e.attempts == 1
        assert len(e.actions) == len(e.observations) - 1 == len(plan(e.request.task.id, e.observations[0]))


@pytest.mark.browser
def test_wrong_click_gets_reward_minus_1(loop, miniwob_worker, miniwob_tasks):
    for name in ("miniwob.click-button", "miniwob.click-tab"):
        tried = 0
        for seed in range(20):
            obs = loop.run(miniwob_worker.reset(miniwob_tasks[name], seed=seed))
            try:
                action = wrong_click(name, obs)
            except StopIteration:  # this seed shows only the wanted control
                continue
            tried += 1
            if tried > 3:
                break
            obs, done, info = loop.run(miniwob_worker.step(action))
            assert done and info["reward"] == -1.0 and info["success"] is False, (name, seed, obs.instruction)
            assert info["target"].element.role in ("button", "tab", "link")
        assert tried > 3


@pytest.mark.browser
def test_answer_ends_the_episode_with_minus_1(loop, miniwob_worker, miniwob_tasks):
    loop.run(miniwob_worker.reset(miniwob_tasks["miniwob.click-button"], seed=0))
    _, done, info = loop.run(miniwob_worker.step(Action.answer_with("done")))
    assert done and info["reward"] == -1.0 and "answered" in info["reason"]


@pytest.mark.browser
def test_leaving_the_task_page_ends_the_episode_with_minus_1(loop, miniwob_worker, miniwob_tasks, miniwob_suite):
    # Another task's page on the same server would report its own reward: not this task's.
    loop.run(miniwob_worker.reset(miniwob_tasks["miniwob.click-button"], seed=0))
    other = miniwob_suite.url(miniwob_tasks["miniwob.click-test"])
    obs, done, info = loop.run(miniwob_worker.step(Action("navigate", url=other)))
    assert done and info["reward"] == -1.0 and "left the task page" in info["reason"]
    # The next reset brings the task page back.
    obs = loop.run(miniwob_worker.reset(miniwob_tasks["miniwob.click-button"], seed=0))
    assert obs.url.endswith("miniwob/click-button.html") and obs.instruction.startswith("Click on the")


@pytest.mark.browser
def test_episode_time_limit_is_configurable(loop, miniwob_tasks):
    with MiniWoBSuite(episode_time_limit_s=0.5) as suite:
        worker = BrowserWorker(suite)
        try:
            obs = loop.run(worker.reset(miniwob_tasks["miniwob.click-button"], seed=0), 60)
            obs, done, info = loop.run(worker.step(Action("wait", seconds=1.0)))
            assert done and info["reward"] == -1.0 and info["reason"] == "timed out"
        finally:
            loop.run(worker.close())
