"""The `train_smoke` stage: the shared trainer on deterministic synthetic batches (no data pipeline).

It exercises everything but the data: model loading, sharded steps, metrics, Orbax checkpoints with
resume (kill it and rerun the same command), the NaN stop and the HF export. Tests and the demo use
it; real training stages (sft, salvage_ds) feed the same Trainer from the trajectory store.
Outputs: <workdir>/train_smoke/{checkpoints/, tensorboard/, metrics.jsonl, hf/, summary.json}.
"""
from __future__ import annotations

import json
import pathlib

import jax

from rmsweb_jax.stages.manifest import TRAINER_CADENCE
from rmsweb_jax.train.loop import Trainer
from rmsweb_jax.train.settings import TrainSettings
from rmsweb_jax.train.synthetic_batches import SyntheticBatches, random_examples

# What the stage reads and writes (rmsweb_jax/stages/manifest.py decides from these whether it is up to date).
CONFIG_READS = ("train", "train_smoke", "model", "mesh", "sharding_rules", "seed")
INPUT_STAGES: dict = {}
OUTPUTS = {"train_smoke/summary.json": None, "train_smoke/hf": None}
FRESH_START = ("train_smoke",)  # a rerun for a change starts afresh (manifest.py)
NON_RESULT_FIELDS = TRAINER_CADENCE  # ... but not for a change of these alone


def check_config(config, workdir) -> None:
    """Returns None once config.train builds the trainer's settings; raises UserError naming the key.
    The pipeline calls it before any stage runs (stages/pipeline.py check_stages)."""
    TrainSettings.from_config(config.get("train"))


def run(config, workdir: pathlib.Path) -> dict:
    """Trains config.train.optimizer.total_steps steps on synthetic examples; writes summary.json."""
    trainer = Trainer(config, workdir, name="train_smoke")
    smoke = config.train_smoke
    examples = random_examples(trainer.model_config, count=smoke.examples, seq_len=smoke.seq_len, seed=smoke.seed)
    source = SyntheticBatches(examples, batch_size=trainer.settings.batch_size, seed=smoke.seed,
                              feed_index=trainer.feeds.index, feed_count=trainer.feeds.count)
    result = trainer.fit(source)
    summary = {"steps": result.step, "resumed_from": result.resumed_from, "last_metrics": result.last_metrics,
               "hf_dir": None if result.hf_dir is None else str(result.hf_dir)}
    if jax.process_index() == 0:
        (result.run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    print(f"[train_smoke] {result.step} steps; last metrics {result.last_metrics}")
    return summary
