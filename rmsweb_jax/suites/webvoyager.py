"""WebVoyager task loaders: the task files (original, Fara's and MolmoWeb's editions), the
reference answers, and the GAIA web subset."""
from __future__ import annotations

import json
import pathlib
import re

from rmsweb_jax.suites.task_files import TaskFileError, field, load_records, site_hosts
from rmsweb_jax.suites.task import Task

_ID = re.compile(r"^(?P<site>.+)--(?P<number>\d+)$")


def load_reference_answers(path: str | pathlib.Path) -> dict[tuple[str, int], tuple[str, str, str]]:
    """Returns (site name, task number) -> (answer, kind "golden"/"possible", site notice) from
    WebVoyager's reference_answer.json."""
    path = pathlib.Path(path)
    try:
        text = path.read_text(encoding="utf-8")
        data = json.loads(text)
    except (OSError, ValueError) as e:
        raise TaskFileError(path, getattr(e, "lineno", 0), f"cannot read reference answers: {e}") from None
    if not isinstance(data, dict):
        raise TaskFileError(path, 1, f"expected one JSON object keyed by site name, got {type(data).__name__}")
    answers: dict[tuple[str, int], tuple[str, str, str]] = {}
    for site, entry in data.items():
        line = text.count("\n", 0, max(text.find(json.dumps(site)), 0)) + 1
        if not isinstance(entry, dict) or not isinstance(entry.get("answers"), list):
            raise TaskFileError(path, line, f"site {site!r}: expected {{notice, answers: [...]}}, got {entry!r:.80}")
        notice = entry.get("notice", "")
        for answer in entry["answers"]:
            if not (isinstance(answer, dict) and isinstance(answer.get("id"), int) and isinstance(answer.get("ans"), str)
                    and answer.get("type") in ("golden", "possible")):
                raise TaskFileError(path, line, f"site {site!r}: answer must be {{id: int, type: golden|possible, "
                                                f"ans: str}}, got {answer!r:.120}")
            answers[(site, answer["id"])] = (answer["ans"], answer["type"], str(notice).strip())
    return answers


def load_webvoyager(path: str | pathlib.Path, reference_answers: str | pathlib.Path | None = None) -> list[Task]:
    """Returns the tasks of a WebVoyager task file (fields web_name, id, ques, web), joined with
    the reference answers when their file is given. Raises TaskFileError naming file and line."""
    answers = load_reference_answers(reference_answers) if reference_answers is not None else {}

    def build(line: int, record) -> Task:
        site = field(record, "web_name", str, path, line, non_empty=True)
        task_id = field(record, "id", str, path, line, non_empty=True)
        match = _ID.match(task_id)
        if match is None:
            raise TaskFileError(path, line, f"key 'id': expected '<site>--<number>', got {task_id!r}")
        url = field(record, "web", str, path, line, non_empty=True)
        answer, kind, notice = answers.get((site, int(match["number"])), (None, None, ""))
        return Task(suite="webvoyager", id=task_id, start_url=url,
                    instruction=field(record, "ques", str, path, line, non_empty=True).strip(), site=site,
                    reference_answer=answer, reference_kind=kind, allowed_hosts=site_hosts(url),
                    metadata={"notice": notice} if notice else {})

    return load_records(path, build)


def load_gaia_web(path: str | pathlib.Path) -> list[Task]:
    """Returns the tasks of WebVoyager's GAIA_web.jsonl (task_id, Level, Final answer, id, web,
    ques). They start on a search engine, so their allowlist is the open web."""

    def build(line: int, record) -> Task:
        level = field(record, "Level", int, path, line)
        url = field(record, "web", str, path, line, non_empty=True)
        return Task(suite="gaia_web", id=field(record, "id", str, path, line, non_empty=True), start_url=url,
                    instruction=field(record, "ques", str, path, line, non_empty=True).strip(),
                    site=site_hosts(url)[0], reference_answer=str(field(record, "Final answer", (str, int, float), path, line)),
                    reference_kind="golden", level=str(level), allowed_hosts=None,
                    metadata={"gaia_task_id": field(record, "task_id", str, path, line)})

    return load_records(path, build)
