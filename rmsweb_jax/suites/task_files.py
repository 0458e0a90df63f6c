"""Reading task files record by record, with the file and line of every record for errors."""
from __future__ import annotations

import json
import pathlib
import urllib.parse
from typing import Any, Callable, Iterator, TypeVar

T = TypeVar("T")


class TaskFileError(ValueError):
    """A malformed record; the message names the file, the line and what was expected."""

    def __init__(self, path: str | pathlib.Path, line: int, message: str):
        super().__init__(f"{path}:{line}: {message}")
        self.path, self.line = str(path), line


def json_records(path: str | pathlib.Path) -> Iterator[tuple[int, Any]]:
    """Yields (line number, record) for a JSON Lines file (blank lines skipped) or a JSON file
    holding a list of records (the line is where the record starts)."""
    path = pathlib.Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise TaskFileError(path, 0, f"cannot read: {e}") from None
    if path.suffix == ".jsonl":
        for number, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                yield number, json.loads(line)
            except ValueError as e:
                raise TaskFileError(path, number, f"invalid JSON: {e}") from None
        return
    yield from _json_array(path, text)


def _json_array(path: pathlib.Path, text: str) -> Iterator[tuple[int, Any]]:
    # Decode element by element so each record knows its line.
    decoder = json.JSONDecoder()
    pos = _skip(text, 0)
    if not text.startswith("[", pos):
        raise TaskFileError(path, _line(text, pos), "expected a JSON list of records")
    pos = _skip(text, pos + 1)
    if text.startswith("]", pos):
        return
    while True:
        try:
            record, end = decoder.raw_decode(text, pos)
        except ValueError as e:
            raise TaskFileError(path, _line(text, pos), f"invalid JSON: {e}") from None
        yield _line(text, pos), record
        pos = _skip(text, end)
        if text.startswith(",", pos):
            pos = _skip(text, pos + 1)
        elif text.startswith("]", pos):
            if text[pos + 1:].strip():
                raise TaskFileError(path, _line(text, pos + 1), "unexpected text after the list")
            return
        else:
            raise TaskFileError(path, _line(text, pos), "expected ',' or ']' between records")


def _skip(text: str, pos: int) -> int:
    while pos < len(text) and text[pos] in " \t\r\n":
        pos += 1
    return pos


def _line(text: str, pos: int) -> int:
    return text.count("\n", 0, pos) + 1


def field(record: Any, key: str, kind: type | tuple[type, ...], path, line: int, *, required: bool = True,
          non_empty: bool = False) -> Any:
    """Returns record[key] checked against `kind`; raises TaskFileError naming file, line, key
    and the value at fault."""
    if not isinstance(record, dict):
        raise TaskFileError(path, line, f"expected a JSON object, got {type(record).__name__}")
    if key not in record:
        if required:
            raise TaskFileError(path, line, f"missing key {key!r} (keys present: {sorted(record)})")
        return None
    value = record[key]
    if isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,)):
        raise TaskFileError(path, line, f"key {key!r}: expected {_names(kind)}, got {value!r}")
    if not isinstance(value, kind):
        raise TaskFileError(path, line, f"key {key!r}: expected {_names(kind)}, got {value!r}")
    if non_empty and isinstance(value, str) and not value.strip():
        raise TaskFileError(path, line, f"key {key!r}: expected a non-empty string, got {value!r}")
    return value


def _names(kind) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join(k.__name__ for k in kinds)


def site_hosts(url: str) -> tuple[str, ...] | None:
    """Returns the allowlist for a start URL: its host without "www." (subdomains admitted), or
    None (the open web) when the URL is empty."""
    if not url:
        return None
    host = (urllib.parse.urlsplit(url).hostname or "").lower()
    return (host[4:] if host.startswith("www.") else host,)


def load_records(path, build: Callable[[int, Any], T]) -> list[T]:
    """Returns [build(line, record) for every record of `path`], checking ids are unique."""
    tasks, seen = [], {}
    for line, record in json_records(path):
        task = build(line, record)
        if task.id in seen:
            raise TaskFileError(path, line, f"duplicate task id {task.id!r} (first on line {seen[task.id]})")
        seen[task.id] = line
        tasks.append(task)
    return tasks
