"""The Task record shared by every suite, and its rubric items."""
from __future__ import annotations

import dataclasses
import json
from typing import Any, Mapping


@dataclasses.dataclass(frozen=True)
class RubricItem:
    """One criterion of a rubric-judged task (WebTailBench)."""

    criterion: str
    description: str
    max_points: float
    condition: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """Returns a JSON-ready dict."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "RubricItem":
        """Returns the item stored by `to_dict`."""
        return cls(criterion=d["criterion"], description=d["description"], max_points=float(d["max_points"]),
                   condition=d.get("condition"))


@dataclasses.dataclass(frozen=True)
class Task:
    """One benchmark task.

    `suite` names the benchmark ("miniwob", "webvoyager", "gaia_web", "online_mind2web",
    "webtailbench"). `start_url` is absolute for live tasks; for MiniWoB it is the task page's
    path under the suite's html folder. `instruction` is empty for MiniWoB, whose instruction
    is generated per seed. `allowed_hosts` is the navigation allowlist (None: the open web).
    `reference_answer` / `reference_kind` ("golden", "possible") and `rubric` are what a judge
    compares against. `metadata` keeps the source's other fields (not hashed).
    """

    suite: str
    id: str
    start_url: str
    instruction: str = ""
    site: str = ""
    reference_answer: str | None = None
    reference_kind: str | None = None
    rubric: tuple[RubricItem, ...] = ()
    level: str = ""
    category: str = ""
    split: str = ""
    allowed_hosts: tuple[str, ...] | None = None
    metadata: dict[str, Any] = dataclasses.field(default_factory=dict, hash=False)

    def to_dict(self) -> dict[str, Any]:
        """Returns a JSON-ready dict."""
        d = dataclasses.asdict(self)
        d["rubric"] = [item.to_dict() for item in self.rubric]
        d["allowed_hosts"] = None if self.allowed_hosts is None else list(self.allowed_hosts)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Task":
        """Returns the task stored by `to_dict`; raises KeyError naming a missing key."""
        hosts = d.get("allowed_hosts")
        return cls(
            suite=d["suite"], id=d["id"], start_url=d["start_url"], instruction=d.get("instruction", ""),
            site=d.get("site", ""), reference_answer=d.get("reference_answer"), reference_kind=d.get("reference_kind"),
            rubric=tuple(RubricItem.from_dict(r) for r in d.get("rubric", ())), level=d.get("level", ""),
            category=d.get("category", ""), split=d.get("split", ""),
            allowed_hosts=None if hosts is None else tuple(hosts), metadata=dict(d.get("metadata", {})),
        )

    def to_json(self) -> str:
        """Returns `to_dict()` as JSON."""
        return json.dumps(self.to_dict(), ensure_ascii=False)

    @classmethod
    def from_json(cls, text: str) -> "Task":
        """Returns the task stored by `to_json`."""
        return cls.from_dict(json.loads(text))
