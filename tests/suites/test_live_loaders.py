"""The WebVoyager, Online-Mind2Web and WebTailBench loaders on the shipped task files."""
import collections
import json

import pytest

from rmsweb_jax.suites.online_mind2web import load_online_mind2web
from rmsweb_jax.suites.records import TaskFileError
from rmsweb_jax.suites.task import Task
from rmsweb_jax.suites.webtailbench import load_webtailbench
from rmsweb_jax.suites.webvoyager import load_gaia_web, load_reference_answers, load_webvoyager


@pytest.fixture(scope="module")
def bench(shared_dir):
    return shared_dir / "benchmarks"


def count_records(path) -> int:
    if path.suffix == ".jsonl":
        return sum(1 for line in path.read_text().splitlines() if line.strip())
    return len(json.loads(path.read_text()))


@pytest.mark.parametrize("name, expected", [
    ("WebVoyager_data.jsonl", 643), ("fara_WebVoyager_data_08312025.jsonl", 595), ("molmoweb_webvoyager.jsonl", 595)])
def test_webvoyager_files_parse_completely(bench, name, expected):
    path = bench / "webvoyager" / name
    tasks = load_webvoyager(path, bench / "webvoyager" / "reference_answer.json")
    assert len(tasks) == count_records(path) == expected
    assert len({t.site for t in tasks}) == 15 and all(t.suite == "webvoyager" for t in tasks)
    assert all(t.instruction and t.start_url.startswith("https://") and t.reference_answer for t in tasks)
    assert collections.Counter(t.reference_kind for t in tasks).keys() == {"golden", "possible"}
    first = tasks[0]
    assert first.id == "Allrecipes--0" and first.allowed_hosts == ("allrecipes.com",)
    assert first.reference_answer.startswith("'Vegetarian Four Cheese Lasagna'")
    assert first.metadata["notice"] == "note that review information is real-time"
    flights = next(t for t in tasks if t.site == "Google Flights")
    assert flights.allowed_hosts == ("google.com",)


def test_reference_answers_and_gaia(bench):
    answers = load_reference_answers(bench / "webvoyager" / "reference_answer.json")
    assert len(answers) == 643
    gaia = load_gaia_web(bench / "webvoyager" / "GAIA_web.jsonl")
    assert len(gaia) == 90 and collections.Counter(t.level for t in gaia) == {"2": 64, "1": 26}
    assert gaia[0].reference_answer == "17" and gaia[0].allowed_hosts is None


@pytest.mark.parametrize("name", ["fara_Online_Mind2Web_06042025.json", "molmoweb_online_mind2web.json",
                                  "stagehand_onlineMind2Web.jsonl"])
def test_online_mind2web_files_parse_completely(bench, name):
    path = bench / "online_mind2web" / name
    tasks = load_online_mind2web(path)
    assert len(tasks) == count_records(path) == 300
    assert collections.Counter(t.level for t in tasks).keys() == {"easy", "medium", "hard"}
    assert all(t.instruction and t.allowed_hosts and t.metadata["reference_length"] > 0 for t in tasks)
    if name.startswith("molmoweb"):
        # PROVENANCE.md says 46 updated ids; the shipped file has 36.
        assert sum(t.id.endswith("_110325") for t in tasks) == 36


@pytest.mark.parametrize("name", ["stagehand_WebTailBench_data.jsonl", "molmoweb_webtailbench.json"])
def test_webtailbench_files_parse_completely(bench, name):
    path = bench / "webtailbench" / name
    tasks = load_webtailbench(path)
    assert len(tasks) == count_records(path) == 609
    assert len({t.category for t in tasks}) == 11
    assert all(t.instruction and not t.instruction.endswith("\r") for t in tasks)
    if name.startswith("stagehand"):
        assert all(t.rubric for t in tasks) and all(t.allowed_hosts is None for t in tasks)
        items = [item for t in tasks for item in t.rubric]
        assert len(items) == 2629 and sum(item.condition is not None for item in items) == 90
        assert all(item.max_points >= 0 for item in items)


def test_tasks_round_trip_through_json(bench):
    tasks = (load_webtailbench(bench / "webtailbench" / "stagehand_WebTailBench_data.jsonl")[:5]
             + load_webvoyager(bench / "webvoyager" / "WebVoyager_data.jsonl")[:5])
    for task in tasks:
        assert Task.from_json(task.to_json()) == task


@pytest.mark.parametrize("loader, suffix, lines, message", [
    (load_webvoyager, ".jsonl", ['{"web_name": "A", "id": "A--0", "ques": "q", "web": "https://a.com/"}',
                                 '{"web_name": "A", "id": "A--1", "ques": "q"}'], r":2: missing key 'web'"),
    (load_webvoyager, ".jsonl", ['{"web_name": "A", "id": "A-zero", "ques": "q", "web": "https://a.com/"}'],
     r":1: key 'id': expected '<site>--<number>'"),
    (load_webvoyager, ".jsonl", ["", '{"web_name": "A", "id": "A--0", "ques": "q", "web": "https://a.com/"}',
                                 "{not json"], r":3: invalid JSON"),
    (load_webvoyager, ".jsonl", ['{"web_name": "A", "id": "A--0", "ques": "q", "web": "https://a.com/"}'] * 2,
     r":2: duplicate task id 'A--0' \(first on line 1\)"),
    (load_online_mind2web, ".json", ['[', '  {"task_id": "t1", "confirmed_task": "c", "website": "https://b.com/",',
                                     '   "reference_length": 3, "level": "easy"},',
                                     '  {"task_id": "t2", "confirmed_task": "c", "website": "https://b.com/",',
                                     '   "reference_length": "3", "level": "easy"}', ']'],
     r":4: key 'reference_length': expected int, got '3'"),
    (load_online_mind2web, ".json", ['[{"task_id": "t1", "confirmed_task": "c", "website": "https://b.com/",',
                                     ' "reference_length": 3, "level": "extreme"}]'], r":1: key 'level'"),
    (load_online_mind2web, ".json", ['{"task_id": "t1"}'], r":1: expected a JSON list"),
    (load_online_mind2web, ".json", ['[{"task_id": "t1", "confirmed_task": "c", "website": "https://b.com/",',
                                     ' "reference_length": 3, "level": "easy"}', ' {"task_id": "t2"}]'],
     r":3: expected ',' or ']'"),
    (load_webtailbench, ".jsonl", ['{"id": "x", "category": "c", "ques": "q", "web": "", '
                                   '"precomputed_rubric": {"items": [{"criterion": "a", "description": "d", '
                                   '"max_points": "four"}]}}'], r":1: precomputed_rubric.items\[0\].max_points"),
    (load_webtailbench, ".json", ['[{"benchmark": "c", "id": "x"}]'], r":1: expected key 'ques' \(Stagehand form\) or 'task_summary'"),
])
def test_malformed_records_name_file_and_line(tmp_path, loader, suffix, lines, message):
    path = tmp_path / f"tasks{suffix}"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(TaskFileError, match=rf"tasks{suffix}{message}"):
        loader(path)


def test_malformed_reference_answers_name_the_file(tmp_path):
    path = tmp_path / "reference_answer.json"
    path.write_text('{\n "Site": {"notice": "", "answers": [{"id": "0", "type": "golden", "ans": "x"}]}\n}')
    with pytest.raises(TaskFileError, match=r"reference_answer.json:2: site 'Site'"):
        load_reference_answers(path)
