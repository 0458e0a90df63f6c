"""The `ground` stage: grounding pretraining on the stored pages, before SFT.

    python -m rmsweb_jax.main --config=configs/demo.py --config.stages=ground,sft --workdir=/tmp/run

For every listed element of every page of the store's training split (config.data's store and split: the
task groups sft trains on; the held-out ones never appear), an instruction naming the element -> the action
at its centre, in the agent's own prompt (rmsweb_jax/data/grounding.py). No browser. Trains config.model.init
with config.train, config.ground.train's values over it, on the same bucketed batches as SFT. With
config.sft.init = "ground" the sft stage then starts from this stage's export, <workdir>/ground/hf (and with
config.sft.grounding_mix > 0 it keeps training on these rows beside the agent's steps).
config.ground.targets_per_row > 1 puts several targets of one page in a row (data/grounding.py GroundingExamples).
After training, the probe: the export's greedy accuracy on config.ground.probe_rows grounding rows of the held-out
task groups' pages (summary's held_out_probe; skipped with a reason when none are held out).
Rerunning the same command resumes from the last checkpoint. Outputs: <workdir>/ground/{checkpoints/,
tensorboard/, metrics.jsonl, hf/, summary.json}.
"""
from __future__ import annotations

import json
import pathlib
import time

import jax
import numpy as np

from rmsweb_jax import storage
from rmsweb_jax.agents.prompt import PromptBuilder, prompt_config_from
from rmsweb_jax.data.grounding import (EncodeGroundingRow, GroundingExamples, GroundingRows, parse_kinds,
                                       parse_targets_per_row)
from rmsweb_jax.data.sft import SFTBatches, SFTDataConfig
from rmsweb_jax.evaluate.step_accuracy import grounding_accuracy
from rmsweb_jax.stages.manifest import TRAINER_CADENCE
from rmsweb_jax.stages.sft_split import load_split
from rmsweb_jax.stages.train_overrides import with_train_overrides
from rmsweb_jax.train.loop import Trainer
from rmsweb_jax.train.metrics import loss_summary
from rmsweb_jax.train.settings import TrainSettings
from rmsweb_jax.train.tokenizer import check_tokenizer

# What the stage reads and writes (rmsweb_jax/stages/manifest.py decides from these whether it is up to date).
CONFIG_READS = ("ground", "data", "train", "model", "mesh", "sharding_rules", "prompt", "seed")
INPUT_STAGES = {"collect": "data.store_dir"}
OUTPUTS = {"ground/summary.json": None, "ground/hf": None}
FRESH_START = ("ground",)  # a rerun for a change starts afresh (manifest.py)
NON_RESULT_FIELDS = TRAINER_CADENCE  # ... but not for a change of these alone

NAME = "ground"


def check_config(config, workdir):
    """Returns the run's config (config.train with config.ground.train over it) once it, config.data,
    config.prompt and config.ground.kinds build their settings (no store read, no model); raises UserError naming
    the key. The pipeline calls it before any stage runs (stages/pipeline.py check_stages), run() first."""
    parse_kinds(config.ground.kinds)
    parse_targets_per_row(config.ground.targets_per_row)
    run_config = with_train_overrides(config, "ground")
    TrainSettings.from_config(run_config.train)
    SFTDataConfig.from_config(config.get("data"), workdir)
    prompt_config_from(config)
    return run_config


def run(config, workdir: pathlib.Path) -> dict:
    """Trains the grounding steps; writes <workdir>/ground/summary.json and returns it."""
    workdir = storage.as_path(workdir)  # local, or gs://
    run_config = check_config(config, workdir)
    kinds = parse_kinds(config.ground.kinds)
    start = time.time()
    data, view, split = load_split(config, workdir)  # the split sft makes from the same settings
    prompt = prompt_config_from(config)
    rows = GroundingRows(view, split.train, prompt, kinds)
    examples = GroundingExamples(rows, config.ground.targets_per_row)
    built_s = time.time() - start
    trainer = Trainer(run_config, workdir, name=NAME)
    tokenizer, image_config = check_tokenizer(trainer.init_dir, trainer.model_config)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    trainer.writer.message(  # above the trainer's progress bar
        f"[ground] {examples!r} ({built_s:.1f} s to index), from {len(split.train)} training steps "
        f"({len(rows.task_keys)} task groups; {len(split.held_out_keys)} held out, not used); "
        f"{data.batching} batches of {trainer.settings.batch_size} rows")
    encoder = EncodeGroundingRow(trainer.init_dir, image_config, prompt, mask=data.mask)
    with SFTBatches(examples, np.arange(len(examples)), data, encoder, rows=trainer.local_rows, pad_id=pad_id,
                    feed_index=trainer.feeds.index, feed_count=trainer.feeds.count) as batches:
        result = trainer.fit(batches)
    losses = loss_summary(result.run_dir / "metrics.jsonl")
    probe = held_out_probe(config, workdir, view, split, prompt, kinds, result.hf_dir)
    summary = {"steps": result.step, "resumed_from": result.resumed_from, "rows": len(rows),
               "targets_per_row": examples.targets_per_row, "examples": len(examples),
               "pages": rows.num_pages, "kinds": list(kinds), "store_dir": str(data.store_dir),
               "train_task_groups": [list(k) for k in rows.task_keys],
               "held_out_task_groups": [list(k) for k in split.held_out_keys],
               "first_loss": losses["first_loss"], "last_loss": losses["last_loss"],
               "last_metrics": result.last_metrics, "seconds": round(time.time() - start, 2),
               "hf_dir": None if result.hf_dir is None else str(result.hf_dir), "init_dir": str(trainer.init_dir),
               "held_out_probe": probe}
    if jax.process_index() == 0:
        storage.write_text_atomic(result.run_dir / "summary.json", json.dumps(summary, indent=2))
    if probe.get("accuracy") is not None:
        print(f"[ground] greedy accuracy on {probe['rows']} grounding rows of held-out pages: {probe['correct']}/"
              f"{probe['rows']} = {100 * probe['accuracy']:.1f}% (turns parsed {100 * probe['parse_rate']:.1f}%)")
    print(f"[ground] {result.step} steps on {len(rows)} grounding rows of {rows.num_pages} pages in {len(examples)} "
          f"examples; {losses['text']}"
          + (f"; HF export {result.hf_dir}" if result.hf_dir else ""))
    return summary


def held_out_probe(config, workdir, view, split, prompt, kinds, hf_dir) -> dict:
    """Returns the grounded model's greedy accuracy on config.ground.probe_rows grounding rows (a seeded draw) of the
    held-out task groups' pages (evaluate/step_accuracy.py grounding_accuracy), or {"skipped": why}."""
    wanted = int(config.ground.probe_rows)
    if wanted <= 0:
        return {"skipped": "config.ground.probe_rows = 0"}
    if not len(split.held_out):
        return {"skipped": "no held-out task groups (config.data.held_out_fraction = 0)"}
    if hf_dir is None:
        return {"skipped": "no HF export (config.train.export_hf = False)"}
    from rmsweb_jax.sampling.chat_model import ChatModel  # heavy; only a probe pays
    rows = GroundingRows(view, split.held_out, prompt, kinds)
    picked = np.random.default_rng(int(config.seed)).choice(len(rows), size=min(wanted, len(rows)), replace=False)
    chosen = [rows[int(i)] for i in sorted(picked)]
    start = time.time()
    chat_model = ChatModel.load(f"hf:{hf_dir}", workdir, config=config, max_batch=int(config.ground.probe_batch_size))
    try:
        report = grounding_accuracy(chat_model, PromptBuilder(prompt), chosen,
                                    max_new_tokens=int(config.ground.probe_max_new_tokens),
                                    batch_size=int(config.ground.probe_batch_size))
    finally:
        chat_model.close()
    return {**report, "held_out_task_groups": len(split.held_out_keys), "seconds": round(time.time() - start, 2)}
