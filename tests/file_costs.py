"""Each test file's CPU seconds, for the order make test runs the files in (tests/conftest.py: the costliest first).

    RMSWEB_TEST_CPU=/tmp/cpu.jsonl make test
    python -m tests.file_costs /tmp/cpu.jsonl      # rewrites tests/file_cpu_seconds.json

The figures only order the files: a stale or missing one costs time, never a test."""
from __future__ import annotations

import collections
import json
import pathlib
import sys

COSTS = pathlib.Path(__file__).with_name("file_cpu_seconds.json")


def nodeid_file(nodeid: str) -> str:
    """Returns the file part of a pytest node id ("tests/x.py::test_y[z]" -> "tests/x.py")."""
    return nodeid.split("::")[0]


def read_costs() -> dict[str, int]:
    """Returns {test file path as pytest names it: CPU seconds} (empty when the file is absent)."""
    return json.loads(COSTS.read_text()) if COSTS.is_file() else {}


def file_costs(rows_path: str) -> dict[str, int]:
    """Returns each file's CPU seconds summed over the rows RMSWEB_TEST_CPU wrote to `rows_path`."""
    costs: collections.Counter = collections.Counter()
    with open(rows_path) as rows:
        for line in rows:
            row = json.loads(line)
            costs[nodeid_file(row["test"])] += row["cpu_s"]
    return {name: round(seconds) for name, seconds in sorted(costs.items())}


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: python -m tests.file_costs ROWS.jsonl (written by RMSWEB_TEST_CPU=ROWS.jsonl)")
    COSTS.write_text(json.dumps(file_costs(sys.argv[1]), indent=1) + "\n")
    print(f"wrote {COSTS}")
