"""The fields of a settings dataclass read from its config block, which holds every default (configs/common.py)."""
from __future__ import annotations

import dataclasses
from typing import Any


def block_fields(cls, block, where: str, *, exact: bool = False, optional: tuple[str, ...] = ()) -> dict[str, Any]:
    """Returns {field: block[field]} for every field of dataclass `cls` in the config block `block` (a ConfigDict
    or dict) named `where` ("config.collect"); raises ValueError naming the keys the block lacks (all but
    `optional`) and, when `exact`, those it has that `cls` does not know."""
    d = dict(block.to_dict() if hasattr(block, "to_dict") else block)
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(d) - set(names)) if exact else []
    if unknown:
        raise ValueError(f"{where} has unknown key(s) {unknown}; known: {sorted(names)}")
    missing = sorted(set(names) - set(d) - set(optional))
    if missing:
        raise ValueError(f"{where} lacks {missing}; configs/common.py sets them all")
    return {name: d[name] for name in names if name in d}
