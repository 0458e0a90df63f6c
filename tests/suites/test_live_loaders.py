"""The WebVoyager, Online-Mind2Web and WebTailBench loaders: on fixture records written here
(every file form, field by field), and on the real task files (counts; skipped when absent)."""
import collections
import json

import pytest

from rmsweb_jax.suites.online_mind2web import load_online_mind2web
from rmsweb_jax.suites.task_files import TaskFileError
from rmsweb_jax.suites.task import Task
from rmsweb_jax.suites.webtailbench import load_webtailbench
from rmsweb_jax.suites.webvoyager import load_gaia_web, load_reference_answers, load_webvoyager
from tests import benchmark_fixtures as fx


@pytest.fixture(scope="module")
def bench(benchmarks_dir):
    return benchmarks_dir


@pytest.fixture(scope="module")
def fixtures(tmp_path_factory):
    """Returns {file name: path} of the fixture files (tests/benchmark_fixtures.py)."""
    return fx.write_benchmark_files(tmp_path_factory.mktemp("benchmarks"))


@pytest.mark.parametrize("name", ["WebVoyager_data.jsonl", "fara_WebVoyager_data_08312025.jsonl",
                                  "molmoweb_webvoyager.jsonl"])
def test_webvoyager_fixture_records_load_field_by_field(fixtures, name):
    name = f"webvoyager/{name}"
    records, answers = fx.BUILDERS[name](), fx.reference_answers()
    tasks = load_webvoyager(fixtures[name], fixtures["webvoyager/reference_answer.json"])
    assert [t.id for t in tasks] == [r["id"] for r in records]
    for task, record in zip(tasks, records):
        site, number = record["web_name"], int(record["id"].rsplit("--", 1)[1])
        [answer] = [a for a in answers[site]["answers"] if a["id"] == number]
        assert (task.suite, task.site, task.start_url, task.instruction) == ("webvoyager", site, record["web"],
                                                                            record["ques"])
        assert (task.reference_answer, task.reference_kind) == (answer["ans"], answer["type"])
        notice = answers[site]["notice"].strip()
        assert task.metadata == ({"notice": notice} if notice else {})
    by_id = {t.id: t for t in tasks}
    assert by_id["Allrecipes--0"].allowed_hosts == ("allrecipes.com",)
    assert by_id["Google Flights--1"].allowed_hosts == ("google.com",)  # the start URL's host, any path
    assert by_id["ArXiv--2"].allowed_hosts == ("arxiv.org",)
    without = load_webvoyager(fixtures[name])  # no reference answers: none joined
    assert [t.id for t in without] == [t.id for t in tasks]
    assert all(t.reference_answer is None and t.metadata == {} for t in without)


def test_reference_answers_and_gaia_fixture_records(fixtures):
    answers = load_reference_answers(fixtures["webvoyager/reference_answer.json"])
    assert len(answers) == len(fx.WEBVOYAGER_SITES) * fx.WEBVOYAGER_PER_SITE
    assert answers[("Allrecipes", 3)] == ("'Allrecipes item 3'", "golden", "note that review information is real-time")
    assert answers[("Booking", 4)] == ("'Booking item 4'", "possible", "")
    gaia = load_gaia_web(fixtures["webvoyager/GAIA_web.jsonl"])
    records = fx.gaia_records()
    assert [(t.id, t.level, t.reference_answer, t.metadata["gaia_task_id"]) for t in gaia] == [
        (r["id"], str(r["Level"]), r["Final answer"], r["task_id"]) for r in records]
    assert all(t.suite == "gaia_web" and t.allowed_hosts is None and t.site == "google.com" and
               t.reference_kind == "golden" for t in gaia)


@pytest.mark.parametrize("name", ["fara_Online_Mind2Web_06042025.json", "molmoweb_online_mind2web.json",
                                  "stagehand_onlineMind2Web.jsonl"])
def test_online_mind2web_fixture_records_load_field_by_field(fixtures, name):
    name = f"online_mind2web/{name}"
    tasks, records = load_online_mind2web(fixtures[name]), fx.BUILDERS[name]()
    assert [(t.id, t.instruction, t.start_url, t.level, t.metadata["reference_length"]) for t in tasks] == [
        (r["task_id"], r["confirmed_task"], r["website"], r["level"], r["reference_length"]) for r in records]
    hosts = {r["website"]: r["website"].split("//")[1].removeprefix("www.").rstrip("/") for r in records}
    assert all(t.allowed_hosts == (hosts[t.start_url],) and t.site == hosts[t.start_url] for t in tasks)
    assert sum(t.id.endswith(fx.UPDATED_SUFFIX) for t in tasks) == (3 if name.endswith("molmoweb_online_mind2web.json")
                                                                    else 0)


def test_webtailbench_fixture_records_load_field_by_field(fixtures):
    records = fx.webtailbench_records()
    tasks = load_webtailbench(fixtures["webtailbench/stagehand_WebTailBench_data.jsonl"])
    assert [(t.id, t.category, t.instruction) for t in tasks] == [
        (r["id"], r["category"], r["ques"].rstrip("\r")) for r in records]
    assert "São Paulo" in tasks[0].instruction  # the file is UTF-8, written unescaped as Stagehand does
    for task, record in zip(tasks, records):
        items = record["precomputed_rubric"]["items"]
        assert [(i.criterion, i.description, i.max_points, i.condition) for i in task.rubric] == [
            (i["criterion"], i["description"], float(i["max_points"]), i.get("condition")) for i in items]
        assert task.start_url == "" and task.allowed_hosts is None  # no start site: the open web
    summaries = load_webtailbench(fixtures["webtailbench/molmoweb_webtailbench.json"])
    assert [(t.id, t.category, t.instruction, t.rubric) for t in summaries] == [
        (r["id"], r["benchmark"], r["task_summary"], ()) for r in fx.molmoweb_webtailbench_records()]


def test_fixture_tasks_round_trip_through_json(fixtures):
    tasks = (load_webtailbench(fixtures["webtailbench/stagehand_WebTailBench_data.jsonl"])
             + load_webvoyager(fixtures["webvoyager/WebVoyager_data.jsonl"],
                               fixtures["webvoyager/reference_answer.json"])
             + load_online_mind2web(fixtures["online_mind2web/stagehand_onlineMind2Web.jsonl"]))
    for task in tasks:
        assert Task.from_json(task.to_json()) == task


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
