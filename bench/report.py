"""The one closing JSON line every bench script prints (no side effects on import)."""
from __future__ import annotations

import json


def emit(bench: str, ours: float | None, anchor: float | None, unit: str, goal: float, *, digits: int = 2,
         **extra) -> None:
    """Prints {"bench", "ours", "anchor", "unit", "ratio" (ours / anchor), "goal", **extra} as one line."""
    known = ours is not None and anchor is not None
    line = {"bench": bench, "ours": None if ours is None else round(ours, digits),
            "anchor": None if anchor is None else round(anchor, digits), "unit": unit,
            "ratio": round(ours / anchor, 3) if known and anchor else None, "goal": goal}
    line.update(extra)
    print(json.dumps(line), flush=True)
