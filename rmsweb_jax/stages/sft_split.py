"""The sft stage's train / held-out split, <workdir>/sft/split.json: written by sft, read by mine and
action_accuracy.

Not a stage: a helper the stages share, like links.py and manifest.py (.importlinter: a stage never
imports another stage), so mine and action_accuracy read the split the sft stage wrote without
importing the sft stage."""
from __future__ import annotations

import json
import pathlib

import numpy as np

from rmsweb_jax.collect.sft_view import SFTView
from rmsweb_jax.collect.store import StoreError
from rmsweb_jax.data.sft import SFTDataConfig, Split, split_by_task
from rmsweb_jax.errors import UserError
from rmsweb_jax.stages import links

SFT_DIR = "sft"  # the sft stage's folder in the workdir (its NAME)
SPLIT_FILE = "split.json"


def split_path(workdir: pathlib.Path) -> pathlib.Path:
    """Returns where the sft stage writes its train / held-out split: <workdir>/sft/split.json (sft/ as linked)."""
    return links.folder(workdir, SFT_DIR) / SPLIT_FILE


def data_settings(config, workdir: pathlib.Path) -> SFTDataConfig:
    """Returns the settings of config.data; data.store_dir "" = the workdir's store (<workdir>/store, as linked)."""
    data = config.get("data")
    if data is not None and not data.get("store_dir"):
        data = dict(data.to_dict() if hasattr(data, "to_dict") else data)
        data["store_dir"] = str(links.folder(workdir, "store"))
    return SFTDataConfig.from_config(data, workdir)


def split_record(data: SFTDataConfig, view: SFTView, split: Split) -> dict:
    """Returns split.json's content: the store, the split settings and both sides' task groups."""
    held = set(split.held_out_keys)
    return {"store_dir": str(data.store_dir), "attempts": data.attempts, "held_out_fraction": data.held_out_fraction,
            "split_seed": data.split_seed, "train_examples": len(split.train), "held_out_examples": len(split.held_out),
            "held_out_task_groups": [list(k) for k in split.held_out_keys],
            "train_task_groups": [list(k) for k in sorted(view.task_keys) if k not in held]}


def saved_split(config, workdir: pathlib.Path) -> tuple[SFTDataConfig, SFTView, Split, pathlib.Path]:
    """Returns (data settings, the store's SFT view, the split the sft stage wrote, its path), the
    split read from <workdir>/sft/split.json, never recomputed: task groups added to the store
    since are on neither side. Raises UserError for a missing split or another store, StoreError
    for held-out groups the store no longer holds."""
    path = split_path(workdir)
    if not path.is_file():
        raise UserError(f"{path}: no split; the sft stage writes it (the held-out task groups are the ones sft "
                        "left out of training): run the sft stage with this workdir first")
    saved = json.loads(path.read_text())
    data = data_settings(config, workdir)
    if str(data.store_dir) != saved["store_dir"]:
        raise UserError(f"config.data.store_dir resolves to {data.store_dir}, but {path} split the store at "
                        f"{saved['store_dir']}: evaluate on the store sft trained from")
    if data.attempts != _saved_attempts(saved):
        raise UserError(f"config.data.attempts is {data.attempts!r}, but {path} split the store's "
                        f"{_saved_attempts(saved)!r} successful attempts (its task groups are those): set "
                        f"config.data.attempts={_saved_attempts(saved)!r}, or rerun sft")
    view = data.view()
    held = [tuple(k) for k in saved["held_out_task_groups"]]
    train = [tuple(k) for k in saved["train_task_groups"]]
    position = {k: i for i, k in enumerate(view.task_keys)}
    missing = [k for k in held if k not in position]
    if missing:
        raise StoreError(f"{path} holds out task groups {missing[:3]} that the store at {data.store_dir} no longer "
                         "has successful steps of: the store changed under the split; rerun sft")
    groups = view.group_index()
    held_idx = np.flatnonzero(np.isin(groups, [position[k] for k in held]))
    train_idx = np.flatnonzero(np.isin(groups, [position[k] for k in train if k in position]))
    return data, view, Split(train_idx, held_idx, tuple(held)), path


def load_split(config, workdir: pathlib.Path) -> tuple[SFTDataConfig, SFTView, Split]:
    """Returns (data settings, the store's SFT view, the train / held-out split); StoreError names a
    missing, empty or other-schema store."""
    data = data_settings(config, workdir)
    view = data.view()
    return data, view, split_by_task(view, data.held_out_fraction, data.split_seed)


def same_split_settings(path: pathlib.Path, data: SFTDataConfig) -> bool:
    """Returns whether `path` holds a split of the same store, attempts, fraction and seed as `data`."""
    if not path.is_file():
        return False
    saved = json.loads(path.read_text())
    return (saved.get("store_dir"), _saved_attempts(saved), saved.get("held_out_fraction"),
            saved.get("split_seed")) == (str(data.store_dir), data.attempts, data.held_out_fraction, data.split_seed)


def _saved_attempts(saved: dict) -> str:
    # A split.json from before config.data.attempts split every successful attempt.
    return saved.get("attempts", "all")


