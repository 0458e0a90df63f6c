"""The `sft` stage: supervised fine-tuning on the store's successful, reflection-free steps.

    python -m rmsweb_jax.main --config=configs/demo.py --config.stages=ground,sft --workdir=/tmp/run

Reads the trajectory store (config.data.store_dir, default <workdir>/store), holds out
config.data.held_out_fraction of the task groups (the `action_accuracy` stage evaluates them),
and trains the model config.sft.init names (config.model.init: hf:/path or random:tiny; "ground": the
ground stage's export, <workdir>/ground/hf) with the shared Trainer on the Grain pipeline of
rmsweb_jax/data/sft.py. config.sft.grounding_mix > 0 mixes that many of the ground stage's rows (of the same
training split's pages) in per training step, so that a grounded model keeps the skill (data/grounding.py
StepsWithGrounding). Rerunning the same command resumes from the last checkpoint, data iterator included.
Outputs: <workdir>/sft/{checkpoints/, tensorboard/, metrics.jsonl, hf/, split.json, summary.json}.
"""
from __future__ import annotations

import json
import pathlib

import jax
import numpy as np

from rmsweb_jax import storage
from rmsweb_jax.agents.prompt import prompt_config_from
from rmsweb_jax.data.grounding import (EncodeStepOrGrounding, GroundingExamples, GroundingRows, StepsWithGrounding,
                                       parse_kinds, parse_targets_per_row)
from rmsweb_jax.data.sft import EncodeSFTExample, SFTBatches, SFTDataConfig
from rmsweb_jax.errors import UserError
from rmsweb_jax.stages import links
from rmsweb_jax.stages.manifest import TRAINER_CADENCE
from rmsweb_jax.stages.sft_split import (SFT_DIR, SPLIT_FILE, data_settings, load_split, same_split_settings,
                                         saved_split, split_path, split_record)
from rmsweb_jax.train.loop import Trainer
from rmsweb_jax.train.metrics import loss_summary
from rmsweb_jax.train.settings import TrainSettings
from rmsweb_jax.train.tokenizer import check_tokenizer

# What the stage reads and writes (rmsweb_jax/stages/manifest.py decides from these whether it is up to date).
# The store is collect's unless data.store_dir names another (then that path is the dependency, not collect).
# With sft.init = "ground" it starts from the ground stage's export (then an input stage too).
# With sft.grounding_mix > 0 it mixes in the ground stage's rows (config.ground's kinds and targets a row).
CONFIG_READS = ("sft", "data", "train", "model", "mesh", "sharding_rules", "prompt", "seed", "ground.kinds",
                "ground.targets_per_row")
INPUT_STAGES = {"collect": "data.store_dir", "ground": "sft.init"}
OUTPUTS = {"sft/summary.json": None, "sft/split.json": None, "sft/hf": None}
FRESH_START = ("sft",)  # a rerun for a change starts afresh (manifest.py)
NON_RESULT_FIELDS = TRAINER_CADENCE  # ... but not for a change of these alone

NAME = SFT_DIR


def check_config(config, workdir) -> None:
    """Returns None once config.train, config.data, config.prompt and config.sft.init build their settings (the
    trainer's, the Grain pipeline's, the prompt's; no store read, no model); raises UserError naming the key. The
    pipeline calls it before any stage runs (stages/pipeline.py check_stages)."""
    TrainSettings.from_config(config.get("train"))
    SFTDataConfig.from_config(config.get("data"), workdir)
    prompt_config_from(config)
    init_spec(config, workdir)
    if grounding_mix(config):
        parse_kinds(config.ground.kinds)
        parse_targets_per_row(config.ground.targets_per_row)


def grounding_mix(config) -> float:
    """Returns config.sft.grounding_mix checked: grounding examples mixed in per SFT training step (0: none)."""
    mix = config.sft.grounding_mix
    if isinstance(mix, bool) or not isinstance(mix, (int, float)) or not 0 <= mix <= 100:
        raise UserError(f"config.sft.grounding_mix = {mix!r}: expected a number in [0, 100] (grounding examples "
                        "mixed in per SFT training step; 0 = none)")
    return float(mix)


def init_spec(config, workdir) -> str:
    """Returns the model.init the SFT run starts from: config.sft.init "model" = config.model.init, "ground" =
    hf:<workdir>/ground/hf (the ground stage's export), or an hf:/path as given; UserError for anything else."""
    init = str(config.sft.init)
    if init == "model":
        return str(config.model.init)
    if init == "ground":
        return f"hf:{links.folder(storage.as_path(workdir), 'ground') / 'hf'}"
    if init.startswith("hf:") and len(init) > 3:
        return init
    raise UserError(f"config.sft.init = {init!r}; expected 'model' (config.model.init), 'ground' (the ground "
                    "stage's export) or 'hf:/path/to/checkpoint'")


def run(config, workdir: pathlib.Path) -> dict:
    """Trains config.train.optimizer.total_steps SFT steps; writes summary.json and split.json."""
    workdir = storage.as_path(workdir)  # local, or gs://
    # The store first: a missing or empty one fails in a second, before any model is loaded.
    if same_split_settings(split_path(workdir), data_settings(config, workdir)):
        # A rerun resumes the run that wrote this split: groups the store gained since stay out of it
        # (a recomputed split could hold out groups the checkpoint already trained on).
        data, view, split, _ = saved_split(config, workdir)
    else:
        data, view, split = load_split(config, workdir)
    run_config = config
    if str(config.sft.init) != "model":
        spec = init_spec(config, workdir)
        if not (storage.user_path(spec[3:]) / "config.json").is_file():
            raise UserError(f"config.sft.init = {config.sft.init!r}: no HF checkpoint at {spec[3:]} (run the ground "
                            "stage with config.train.export_hf=True first, or give hf:/path/to/checkpoint)")
        run_config = config.copy_and_resolve_references()
        run_config.model.init = spec
    trainer = Trainer(run_config, workdir, name=NAME)
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
    prompt = prompt_config_from(config)
    source, indices, mixed, mix = view, split.train, 0, grounding_mix(config)
    if mix:
        rows = GroundingRows(view, split.train, prompt, parse_kinds(config.ground.kinds))
        examples = GroundingExamples(rows, config.ground.targets_per_row)
        mixed = round(mix * len(split.train))
        source = StepsWithGrounding(view, split.train, examples, mixed, seed=int(config.seed))
        indices = np.arange(len(source))
        trainer.writer.message(f"[sft] {source!r}: grounding_mix {mix} ({examples!r})")
        encoder = EncodeStepOrGrounding(trainer.init_dir, image_config, prompt, mask=data.mask)
    else:
        encoder = EncodeSFTExample(trainer.init_dir, image_config, prompt, mask=data.mask)
    with SFTBatches(source, indices, data, encoder, rows=trainer.local_rows, pad_id=pad_id,
                    feed_index=trainer.feeds.index, feed_count=trainer.feeds.count) as batches:
        result = trainer.fit(batches)
    losses = loss_summary(result.run_dir / "metrics.jsonl")  # the first and last logged windows' means
    summary = {"steps": result.step, "resumed_from": result.resumed_from, "train_examples": len(split.train),
               "grounding_examples_mixed": mixed,
               "held_out_examples": len(split.held_out), "first_loss": losses["first_loss"],
               "first_loss_steps": losses["first_steps"], "last_loss": losses["last_loss"],
               "last_loss_steps": losses["last_steps"], "loss_windows": losses["windows"],
               "last_metrics": result.last_metrics,
               "hf_dir": None if result.hf_dir is None else str(result.hf_dir), "init_dir": str(trainer.init_dir)}
    if writer:
        storage.write_text_atomic(result.run_dir / "summary.json", json.dumps(summary, indent=2))
    print(f"[sft] {result.step} steps; {losses['text']}; checkpoints in {result.run_dir / 'checkpoints'}"
          + (f"; HF export {result.hf_dir}" if result.hf_dir else ""))
    return summary
