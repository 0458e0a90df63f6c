"""tests/file_costs.py: the per-file CPU seconds that order make test's files (tests/conftest.py)."""
import json

from tests.file_costs import file_costs


def test_file_costs_sum_each_files_tests(tmp_path):
    rows = tmp_path / "cpu.jsonl"
    rows.write_text("\n".join(json.dumps(r) for r in [
        {"test": "tests/a/test_x.py::test_one", "cpu_s": 1.25, "wall_s": 2.0},
        {"test": "tests/a/test_x.py::test_two[p]", "cpu_s": 2.5, "wall_s": 2.0},
        {"test": "tests/test_y.py::test_three", "cpu_s": 0.4, "wall_s": 1.0}]) + "\n")
    assert file_costs(str(rows)) == {"tests/a/test_x.py": 4, "tests/test_y.py": 0}

