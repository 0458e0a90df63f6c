"""Online-Mind2Web task loader (Fara's, MolmoWeb's and Stagehand's editions)."""
from __future__ import annotations

import pathlib

from rmsweb_jax.suites.task_files import TaskFileError, field, load_records, site_hosts
from rmsweb_jax.suites.task import Task

LEVELS = ("easy", "medium", "hard")


def load_online_mind2web(path: str | pathlib.Path) -> list[Task]:
    """Returns the tasks of an Online-Mind2Web file (.json list or .jsonl; fields task_id,
    confirmed_task, website, reference_length, level). Raises TaskFileError naming file and line."""

    def build(line: int, record) -> Task:
        level = field(record, "level", str, path, line)
        if level not in LEVELS:
            raise TaskFileError(path, line, f"key 'level': expected one of {list(LEVELS)}, got {level!r}")
        length = field(record, "reference_length", int, path, line)
        if length <= 0:
            raise TaskFileError(path, line, f"key 'reference_length': expected a positive step count, got {length!r}")
        url = field(record, "website", str, path, line, non_empty=True)
        hosts = site_hosts(url)
        return Task(suite="online_mind2web", id=field(record, "task_id", str, path, line, non_empty=True),
                    start_url=url, instruction=field(record, "confirmed_task", str, path, line, non_empty=True).strip(),
                    site=hosts[0], level=level, allowed_hosts=hosts, metadata={"reference_length": length})

    return load_records(path, build)
