"""Fixtures for judge tests: task records loaded with our loaders, each test run twice: on the
small fixture records (tests/benchmark_fixtures.py) and on the real files (skipped when absent)."""
import pytest

from rmsweb_jax.suites import load_online_mind2web, load_webtailbench, load_webvoyager


@pytest.fixture(scope="session")
def webvoyager_tasks(benchmark_files):
    """Returns {id: Task} of WebVoyager's original task file joined with its reference answers."""
    tasks = load_webvoyager(benchmark_files / "webvoyager" / "WebVoyager_data.jsonl",
                            benchmark_files / "webvoyager" / "reference_answer.json")
    return {t.id: t for t in tasks}


@pytest.fixture(scope="session")
def mind2web_tasks(benchmark_files):
    """Returns {task_id: Task} of Fara's Online-Mind2Web edition."""
    tasks = load_online_mind2web(benchmark_files / "online_mind2web" / "fara_Online_Mind2Web_06042025.json")
    return {t.id: t for t in tasks}


@pytest.fixture(scope="session")
def webtailbench_tasks(benchmark_files):
    """Returns {id: Task} of Stagehand's WebTailBench file (with V1 rubrics)."""
    return {t.id: t for t in load_webtailbench(benchmark_files / "webtailbench" / "stagehand_WebTailBench_data.jsonl")}
