"""A stage's own training values over config.train: config.<block>.train (batch size, steps, rate).

Not a stage: a helper the training stages share, like links.py and manifest.py (a stage never imports
another stage). The ground stage trains with config.train (the sft stage's) with config.ground.train's
values that are not None written over it, and salvage does the same with config.salvage.train.
"""
from __future__ import annotations

import ml_collections

from rmsweb_jax.errors import UserError

# config.<block>.train field -> the config.train field it replaces; None keeps config.train's (configs/common.py)
TRAIN_OVERRIDES = {"batch_size": ("batch_size",), "total_steps": ("optimizer", "total_steps"),
                   "lr": ("optimizer", "lr"), "warmup_steps": ("optimizer", "warmup_steps"),
                   "end_lr_fraction": ("optimizer", "end_lr_fraction")}


def with_train_overrides(config, block: str) -> ml_collections.ConfigDict:
    """Returns a copy of `config` whose `train` block is config.train with every config.<block>.train field that
    is not None written over it; UserError names an unknown field or a value out of range."""
    out = config.copy_and_resolve_references()
    overrides = config[block].get("train")
    if overrides is None:
        return out
    unknown = sorted(set(overrides.keys()) - set(TRAIN_OVERRIDES))
    if unknown:
        raise UserError(f"config.{block}.train has unknown field(s) {unknown}: expected some of "
                        f"{sorted(TRAIN_OVERRIDES)}")
    for name, path in TRAIN_OVERRIDES.items():
        value = overrides.get(name)
        if value is None:
            continue
        if (name in ("batch_size", "total_steps") and value < 1) or (name == "lr" and value <= 0) or \
                (name == "end_lr_fraction" and not 0 <= value <= 1) or (name == "warmup_steps" and value < 0):
            raise UserError(f"config.{block}.train.{name} = {value!r}: out of range (None keeps "
                            f"config.train.{'.'.join(path)})")
        node = out.train
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = type(node[path[-1]])(value)
    return out
