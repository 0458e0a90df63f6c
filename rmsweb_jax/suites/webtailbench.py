"""WebTailBench task loader: Stagehand's JSON Lines with V1 rubrics, or MolmoWeb's summary list."""
from __future__ import annotations

import pathlib

from rmsweb_jax.suites.task_files import TaskFileError, field, load_records, site_hosts
from rmsweb_jax.suites.task import RubricItem, Task


def load_webtailbench(path: str | pathlib.Path) -> list[Task]:
    """Returns the tasks of a WebTailBench file: records {id, category, ques, web,
    precomputed_rubric: {items: [...]}} (Stagehand) or {benchmark, id, task_summary} (MolmoWeb).
    Tasks without a start site get start_url "" and the open web as allowlist. Raises
    TaskFileError naming file and line."""

    def build(line: int, record) -> Task:
        task_id = field(record, "id", str, path, line, non_empty=True)
        if isinstance(record, dict) and "task_summary" in record:
            return Task(suite="webtailbench", id=task_id, start_url="",
                        instruction=field(record, "task_summary", str, path, line, non_empty=True).strip(),
                        category=field(record, "benchmark", str, path, line, non_empty=True))
        if "ques" not in record:
            raise TaskFileError(path, line, f"expected key 'ques' (Stagehand form) or 'task_summary' (MolmoWeb form); "
                                            f"keys present: {sorted(record)}")
        url = field(record, "web", str, path, line)
        rubric = field(record, "precomputed_rubric", dict, path, line)
        items = rubric.get("items")
        if not isinstance(items, list) or not items:
            raise TaskFileError(path, line, f"key 'precomputed_rubric.items': expected a non-empty list, got {items!r:.80}")
        return Task(suite="webtailbench", id=task_id, start_url=url,
                    instruction=field(record, "ques", str, path, line, non_empty=True).strip(),
                    site=(site_hosts(url) or ("",))[0], category=field(record, "category", str, path, line, non_empty=True),
                    rubric=tuple(_rubric_item(path, line, i, item) for i, item in enumerate(items)),
                    allowed_hosts=site_hosts(url))

    return load_records(path, build)


def _rubric_item(path, line: int, index: int, item) -> RubricItem:
    where = f"precomputed_rubric.items[{index}]"
    if not isinstance(item, dict):
        raise TaskFileError(path, line, f"{where}: expected an object, got {item!r:.80}")
    for key in ("criterion", "description"):
        if not isinstance(item.get(key), str) or not item[key].strip():
            raise TaskFileError(path, line, f"{where}.{key}: expected a non-empty string, got {item.get(key)!r:.80}")
    points = item.get("max_points")
    if isinstance(points, bool) or not isinstance(points, (int, float)) or points < 0:
        raise TaskFileError(path, line, f"{where}.max_points: expected a non-negative number, got {points!r}")
    condition = item.get("condition")
    if condition is not None and not isinstance(condition, str):
        raise TaskFileError(path, line, f"{where}.condition: expected a string, got {condition!r:.80}")
    return RubricItem(criterion=item["criterion"].strip(), description=item["description"].strip(),
                      max_points=float(points), condition=condition)
