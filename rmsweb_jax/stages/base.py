"""The `base` stage: the base policy's grounding pretraining on synthetic pages, the step the real recipe gets from
Qwen3-VL's own pretraining (the model learns to read its page: find the instructed element, copy its point).

    python -m rmsweb_jax.main --config=configs/base.py --workdir=workdir/base          # make base

No store and no browser: config.base.pages synthetic pages of seed config.base.seed (rmsweb_jax/data/
synthetic_pages.py: element lists whose printed points are drawn over the whole grid, names from a large pool),
their grounding rows in the agent's own prompt (data/grounding.py's rows and examples), trained with config.train,
config.base.train's values over it. The probe: greedy turns on config.base.probe_rows rows of pages of seed
config.base.held_out_seed (never a training page): inside the element's box, exactly the printed point, the
instructed word typed; every config.base.probe_every steps (<workdir>/base/probe.jsonl, the curve) and after
training (summary.json). Rerunning the same command resumes from the last checkpoint.
Outputs: <workdir>/base/{checkpoints/, tensorboard/, metrics.jsonl, probe.jsonl, hf/, summary.json}.
"""
from __future__ import annotations

import dataclasses
import json
import pathlib
import time

import jax
import numpy as np

from rmsweb_jax import storage
from rmsweb_jax.agents.prompt import PromptBuilder, prompt_config_from
from rmsweb_jax.config_block import block_fields
from rmsweb_jax.data.grounding import EncodeGroundingRow, GroundingExamples, parse_kinds, parse_targets_per_row
from rmsweb_jax.data.sft import SFTBatches, SFTDataConfig
from rmsweb_jax.data.synthetic_pages import SyntheticGroundingRows, SyntheticPages
from rmsweb_jax.errors import UserError
from rmsweb_jax.evaluate.step_accuracy import grounding_accuracy
from rmsweb_jax.stages.manifest import TRAINER_CADENCE
from rmsweb_jax.stages.train_overrides import with_train_overrides
from rmsweb_jax.train.loop import Trainer
from rmsweb_jax.train.metrics import loss_summary
from rmsweb_jax.train.settings import TrainSettings
from rmsweb_jax.train.tokenizer import check_tokenizer

# What the stage reads and writes (rmsweb_jax/stages/manifest.py decides from these whether it is up to date).
CONFIG_READS = ("base", "data", "train", "model", "mesh", "sharding_rules", "prompt", "seed")
INPUT_STAGES: dict = {}
OUTPUTS = {"base/summary.json": None, "base/hf": None}
FRESH_START = ("base",)  # a rerun for a change starts afresh (manifest.py)
NON_RESULT_FIELDS = (*TRAINER_CADENCE, "base.probe_every")  # ... but not for a change of these alone

NAME = "base"
FIRST_SEED = 1_000_000  # a base's pages: seeds no MiniWoB++ episode of the demo plays


@dataclasses.dataclass(frozen=True)
class BaseSettings:
    """config.base, checked (configs/common.py documents each field)."""
    pages: int
    seed: int
    held_out_seed: int
    min_elements: int
    max_elements: int
    kinds: str
    targets_per_row: int
    probe_rows: int
    probe_every: int
    probe_batch_size: int
    probe_max_new_tokens: int

    @classmethod
    def from_config(cls, block) -> "BaseSettings":
        fields = {k: v for k, v in block.to_dict().items() if k != "train"}
        try:
            s = cls(**block_fields(cls, fields, "config.base", exact=True))
        except ValueError as err:
            raise UserError(str(err)) from None
        parse_kinds(s.kinds)
        parse_targets_per_row(s.targets_per_row)
        if min(s.seed, s.held_out_seed) < FIRST_SEED or s.seed == s.held_out_seed:
            raise UserError(f"config.base.seed = {s.seed}, held_out_seed = {s.held_out_seed}: expected two different "
                            f"seeds >= {FIRST_SEED:,} (below it, seeds the demo's tasks play)")
        if s.pages < 1 or s.probe_rows < 0 or s.probe_every < 0 or s.probe_batch_size < 1:
            raise UserError(f"config.base: pages = {s.pages}, probe_rows = {s.probe_rows}, probe_every = "
                            f"{s.probe_every}, probe_batch_size = {s.probe_batch_size}: expected pages >= 1, "
                            "probe_batch_size >= 1 and the others >= 0")
        try:
            SyntheticPages(s.seed, s.pages, s.min_elements, s.max_elements)  # checks the element counts
        except ValueError as err:
            raise UserError(f"config.base: {err}") from None
        return s


def check_config(config, workdir):
    """Returns (the run's config: config.train with config.base.train over it, the settings) once every block it
    reads builds its settings (no model, no page); raises UserError naming the key. The pipeline calls it before any
    stage runs (stages/pipeline.py check_stages), run() first."""
    settings = BaseSettings.from_config(config.base)
    run_config = with_train_overrides(config, "base")
    TrainSettings.from_config(run_config.train)
    SFTDataConfig.from_config(config.get("data"), workdir)
    prompt_config_from(config)
    return run_config, settings


def run(config, workdir: pathlib.Path) -> dict:
    """Trains the base on synthetic pages; writes <workdir>/base/summary.json and returns it."""
    workdir = storage.as_path(workdir)
    run_config, s = check_config(config, workdir)
    start = time.time()
    data, prompt, kinds = SFTDataConfig.from_config(config.get("data"), workdir), prompt_config_from(config), \
        parse_kinds(s.kinds)
    rows = SyntheticGroundingRows(SyntheticPages(s.seed, s.pages, s.min_elements, s.max_elements), prompt, kinds)
    examples = GroundingExamples(rows, s.targets_per_row)
    indexed_s = time.time() - start
    trainer = Trainer(run_config, workdir, name=NAME)
    tokenizer, image_config = check_tokenizer(trainer.init_dir, trainer.model_config)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    trainer.writer.message(f"[base] {examples!r} ({indexed_s:.1f} s to index); {data.batching} batches of "
                           f"{trainer.settings.batch_size} rows")
    probe = Probe(s, prompt, kinds, tokenizer, image_config, trainer)
    encoder = EncodeGroundingRow(trainer.init_dir, image_config, prompt, mask=data.mask)
    with SFTBatches(examples, np.arange(len(examples)), data, encoder, rows=trainer.local_rows, pad_id=pad_id,
                    feed_index=trainer.feeds.index, feed_count=trainer.feeds.count) as batches:
        result = trainer.fit(batches, after_step=probe.maybe)
    losses = loss_summary(result.run_dir / "metrics.jsonl")
    final = probe.report(trainer.step_count, say=print) if s.probe_rows else {"skipped": "config.base.probe_rows = 0"}
    summary = {"steps": result.step, "resumed_from": result.resumed_from, "pages": s.pages, "seed": s.seed,
               "held_out_seed": s.held_out_seed, "rows": len(rows), "examples": len(examples),
               "targets_per_row": s.targets_per_row, "kinds": list(kinds), "first_loss": losses["first_loss"],
               "last_loss": losses["last_loss"], "last_metrics": result.last_metrics,
               "seconds": round(time.time() - start, 2), "init_dir": str(trainer.init_dir),
               "hf_dir": None if result.hf_dir is None else str(result.hf_dir), "held_out_probe": final}
    if jax.process_index() == 0:
        storage.write_text_atomic(result.run_dir / "summary.json", json.dumps(summary, indent=2))
    if final.get("rows"):
        print(f"[base] held-out pages, {final['rows']} rows: inside the box {100 * final['accuracy']:.1f}%, the "
              f"printed point exactly {100 * final['exact_rate']:.1f}%, words typed {final['typed_exact']}/"
              f"{final['typed_rows']}")
    print(f"[base] {result.step} steps on {len(rows)} rows of {s.pages} synthetic pages; {losses['text']}")
    return summary


class Probe:
    """Greedy grounding on held-out synthetic pages with the trainer's current weights (a chat model over them,
    built for each probe: a step donates the arrays of the one before)."""

    def __init__(self, s: BaseSettings, prompt, kinds, tokenizer, image_config, trainer: Trainer):
        self.s, self.prompt, self.tokenizer, self.image_config, self.trainer = s, prompt, tokenizer, image_config, \
            trainer
        held_out = SyntheticGroundingRows(SyntheticPages(s.held_out_seed, max(1, s.probe_rows), s.min_elements,
                                                         s.max_elements), prompt, kinds)
        self.rows = [held_out[i] for i in range(min(s.probe_rows, len(held_out)))]
        self.curve = trainer.run_dir / "probe.jsonl"
        # a resumed run keeps the curve so far (up to its checkpoint; later probes of the stopped run are redone)
        done = self.curve.read_text().splitlines() if self.curve.is_file() else []
        self.lines = [line for line in done if json.loads(line)["step"] <= trainer.step_count]

    def maybe(self, step: int) -> None:
        if self.s.probe_rows and self.s.probe_every and step % self.s.probe_every == 0 and \
                step < self.trainer.settings.total_steps:
            self.report(step)

    def report(self, step: int, say=None) -> dict:
        """Returns the probe of the current weights at `step`, appended to probe.jsonl; `say` prints its line
        (default: above the trainer's progress bar)."""
        from rmsweb_jax.sampling.chat_model import ChatModel, default_stop_token_ids  # heavy; only a probe pays
        start = time.time()
        chat_model = ChatModel(self.trainer.model(), self.tokenizer, image_config=self.image_config,
                               stop_token_ids=default_stop_token_ids(self.tokenizer, self.trainer.init_dir),
                               max_batch=self.s.probe_batch_size)
        try:
            out = grounding_accuracy(chat_model, PromptBuilder(self.prompt), self.rows,
                                     max_new_tokens=self.s.probe_max_new_tokens, batch_size=self.s.probe_batch_size)
        finally:
            chat_model.close()
        out = {"step": step, **{k: v for k, v in out.items() if k != "by_task"},
               "seconds": round(time.time() - start, 2)}
        self.lines.append(json.dumps(out))
        if jax.process_index() == 0:
            storage.write_text_atomic(self.curve, "\n".join(self.lines) + "\n")
        (say or self.trainer.writer.message)(
            f"[base] probe at step {step}: inside the box {100 * out['accuracy']:.1f}%, exact "
            f"{100 * out['exact_rate']:.1f}%, typed {out['typed_exact']}/{out['typed_rows']}")
        return out
