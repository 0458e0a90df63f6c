"""Fixtures for judge tests: real records of the shared benchmark files, loaded with our loaders."""
import pytest

from rmsweb_jax.suites import load_online_mind2web, load_webtailbench, load_webvoyager


@pytest.fixture(scope="session")
def benchmarks(shared_dir):
    return shared_dir / "benchmarks"


@pytest.fixture(scope="session")
def webvoyager_tasks(benchmarks):
    """Returns {id: Task} of WebVoyager's original task file joined with its reference answers."""
    tasks = load_webvoyager(benchmarks / "webvoyager" / "WebVoyager_data.jsonl",
                            benchmarks / "webvoyager" / "reference_answer.json")
    return {t.id: t for t in tasks}


@pytest.fixture(scope="session")
def mind2web_tasks(benchmarks):
    """Returns {task_id: Task} of Fara's Online-Mind2Web edition."""
    tasks = load_online_mind2web(benchmarks / "online_mind2web" / "fara_Online_Mind2Web_06042025.json")
    return {t.id: t for t in tasks}


@pytest.fixture(scope="session")
def webtailbench_tasks(benchmarks):
    """Returns {id: Task} of Stagehand's WebTailBench file (with V1 rubrics)."""
    return {t.id: t for t in load_webtailbench(benchmarks / "webtailbench" / "stagehand_WebTailBench_data.jsonl")}
