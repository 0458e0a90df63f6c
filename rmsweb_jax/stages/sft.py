"""The `sft` stage: supervised fine-tuning on the store's successful, reflection-free steps.

    python -m rmsweb_jax.main --config=configs/demo.py --config.stages=sft --workdir=/tmp/run

Reads the trajectory store (config.data.store_dir, default <workdir>/store), holds out
config.data.held_out_fraction of the task groups (the `action_accuracy` stage evaluates them),
and trains the model of config.model.init (hf:/path — also an earlier stage's export such as
hf:<workdir>/sft/hf — or random:tiny) with the shared Trainer on the Grain pipeline of
rmsweb_jax/data/sft.py. Rerunning the same command resumes from the last checkpoint, data
iterator included. Outputs: <workdir>/sft/{checkpoints/, tensorboard/, metrics.jsonl, hf/,
split.json, summary.json}.
"""
from __future__ import annotations

import json
import pathlib

import jax
import numpy as np

from rmsweb_jax import storage
from rmsweb_jax.agents.prompt import prompt_config_from
from rmsweb_jax.collect.sft_view import SFTView
from rmsweb_jax.collect.store import StoreError
from rmsweb_jax.data.sft import SFTBatches, SFTDataConfig, Split, split_by_task
from rmsweb_jax.errors import UserError
from rmsweb_jax.stages import links

# What the stage reads and writes (rmsweb_jax/stages/manifest.py decides from these whether it is up to date).
# The store is collect's unless data.store_dir names another (then that path is the dependency, not collect).
CONFIG_READS = ("data", "train", "model", "mesh", "sharding_rules", "prompt", "seed")
INPUT_STAGES = {"collect": "data.store_dir"}
OUTPUTS = {"sft/summary.json": None, "sft/split.json": None, "sft/hf": None}
FRESH_START = ("sft",)  # a rerun for a change starts afresh (manifest.py)

NAME = "sft"
SPLIT_FILE = "split.json"


def split_path(workdir: pathlib.Path) -> pathlib.Path:
    """Returns where the sft stage writes its train / held-out split: <workdir>/sft/split.json (sft/ as linked)."""
    return links.folder(workdir, NAME) / SPLIT_FILE


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


def check_tokenizer(tokenizer_dir: str | pathlib.Path, model_config) -> tuple[object, object]:
    """Returns (tokenizer, image config) of the checkpoint folder, checked against the model's config."""
    from rmsweb_jax.sampling.chat_model import image_config_from_checkpoint
    from rmsweb_jax.processing.prompt_tokens import IMAGE_TOKEN, load_tokenizer
    tokenizer = load_tokenizer(tokenizer_dir)
    image_token = tokenizer.convert_tokens_to_ids(IMAGE_TOKEN)
    if image_token != model_config.image_token_id:
        raise UserError(f"the tokenizer in {tokenizer_dir} maps {IMAGE_TOKEN} to {image_token}, the model's "
                        f"image_token_id is {model_config.image_token_id}: tokenizer and model do not belong together")
    image_config = image_config_from_checkpoint(tokenizer_dir)
    vision = model_config.vision
    ours = (image_config.patch_size, image_config.merge_size, image_config.temporal_patch_size)
    theirs = (vision.patch_size, vision.spatial_merge_size, vision.temporal_patch_size)
    if ours != theirs:
        raise UserError(f"{tokenizer_dir}/preprocessor_config.json patch/merge/temporal sizes {ours} differ from "
                        f"the model's vision config {theirs}")
    return tokenizer, image_config


def run(config, workdir: pathlib.Path) -> dict:
    """Trains config.train.optimizer.total_steps SFT steps; writes summary.json and split.json."""
    from rmsweb_jax.train.loop import Trainer
    workdir = storage.as_path(workdir)  # local, or gs://
    # The store first: a missing or empty one fails in a second, before any model is loaded.
    if same_split_settings(split_path(workdir), data_settings(config, workdir)):
        # A rerun resumes the run that wrote this split: groups the store gained since stay out of it
        # (a recomputed split could hold out groups the checkpoint already trained on).
        data, view, split, _ = saved_split(config, workdir)
    else:
        data, view, split = load_split(config, workdir)
    trainer = Trainer(config, workdir, name=NAME)
    tokenizer, image_config = check_tokenizer(trainer.init_dir, trainer.model_config)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    writer = jax.process_index() == 0
    if writer:
        trainer.run_dir.mkdir(parents=True, exist_ok=True)
        # action_accuracy evaluates exactly these held-out groups, whatever the store holds by then.
        storage.write_text_atomic(trainer.run_dir / SPLIT_FILE, json.dumps(split_record(data, view, split), indent=2))
    trainer.writer.message(  # above the trainer's progress bar
        f"[sft] {view!r}: {len(split.train)} training steps, {len(split.held_out)} held out "
        f"({len(split.held_out_keys)} task groups); {data.batching} batches of {trainer.settings.batch_size} rows, "
        f"loss mask {data.mask}, {data.worker_count} Grain workers")
    with SFTBatches(view, split.train, data, tokenizer_dir=trainer.init_dir, image_config=image_config,
                    rows=trainer.local_rows, prompt_config=prompt_config_from(config), pad_id=pad_id,
                    process_index=jax.process_index(), process_count=jax.process_count()) as batches:
        result = trainer.fit(batches)
    losses = _losses(result.run_dir / "metrics.jsonl")
    summary = {"steps": result.step, "resumed_from": result.resumed_from, "train_examples": len(split.train),
               "held_out_examples": len(split.held_out), "first_loss": losses[0] if losses else None,
               "last_loss": losses[-1] if losses else None, "last_metrics": result.last_metrics,
               "hf_dir": None if result.hf_dir is None else str(result.hf_dir), "init_dir": str(trainer.init_dir)}
    if writer:
        storage.write_text_atomic(result.run_dir / "summary.json", json.dumps(summary, indent=2))
    first = "?" if summary["first_loss"] is None else f"{summary['first_loss']:.3f}"
    last = "?" if summary["last_loss"] is None else f"{summary['last_loss']:.3f}"
    print(f"[sft] {result.step} steps; loss {first} -> {last}; checkpoints in {result.run_dir / 'checkpoints'}"
          + (f"; HF export {result.hf_dir}" if result.hf_dir else ""))
    return summary


def _losses(path: pathlib.Path) -> list[float]:
    """Returns the reported (windowed mean) loss of every metrics step, in step order ([] when absent)."""
    from rmsweb_jax.train.metrics import read_metrics
    if not path.is_file():
        return []
    return [m["loss"] for _, m in sorted(read_metrics(path).items()) if "loss" in m]
