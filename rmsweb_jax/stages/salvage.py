"""The `salvage` stage: Salvage-DS, group-relative RL of the SFT policy on the mined critical states.

    python -m rmsweb_jax.main --config=configs/demo.py --config.stages=salvage --workdir=/tmp/run

Reads the mine stage's state set (config.salvage.states, default <workdir>/mine/states.arrayrecord)
and trains the policy of config.salvage.init (default hf:<workdir>/sft/hf, the sft export) with the
shared Trainer and the Salvage-DS loss (train/rl_loss.py), through the learner of config.salvage.algorithm
(salvage/learner.py: "salvage_ds", or "grpo", plain GRPO: the ablation without Salvage-DS's reward, gates
and anchor). The stage wires the config and the files; each update is the learner's:

1. dynamic sampling (salvage/dynamic_sampling.py): states in a seeded order, G responses each from
   the CURRENT policy (ChatModel.sample_groups: one prefill per state), scored against the state's
   reference action (salvage/rewards.py), gated (salvage/gates.py), until B groups are accepted or
   the draw budget is spent;
2. the batch (salvage/batches.py): policy rows of the accepted groups (exact sampled ids, their
   advantages), anchor rows of the rejected ones the anchor keeps (reference tool call only), and with
   config.salvage.grounding_rows > 0 grounding rows of the training split's pages as anchor rows in the room
   left (salvage/grounding_anchor.py);
3. old log-probs of the exact rows from the trainer's own forward pass (and the frozen SFT
   policy's when config.salvage.loss.kl_beta > 0), then config.salvage.epochs optimizer steps on them (1 by
   default; from the second the importance ratio leaves 1 and the clip bounds act; a checkpoint waits for the
   last); the sampler's model is refreshed from the new parameters (the step donates the old ones).

The sampler's state (epoch, position, draws) is the checkpoint's data state: a rerun resumes the
exact sequence of draws. Sampling metrics (groups accepted / rejected / anchored, states drawn,
shortfall, reward mean, correct share, rows) are reported with the loss's. Outputs:
<workdir>/salvage/{checkpoints/, tensorboard/, metrics.jsonl, hf/, summary.json}.
"""
from __future__ import annotations

import json
import pathlib

import jax

from rmsweb_jax import storage
from rmsweb_jax.agents.prompt import PromptBuilder, prompt_config_from
from rmsweb_jax.data.batching import Buckets
from rmsweb_jax.data.grounding import GroundingRows, parse_kinds
from rmsweb_jax.errors import UserError
from rmsweb_jax.mining.state_set import StateSet
from rmsweb_jax.model_init import load_model
from rmsweb_jax.models.from_config import mesh_from_config
from rmsweb_jax.salvage.grounding_anchor import GroundingAnchors
from rmsweb_jax.salvage.learner import learner_class
from rmsweb_jax.salvage.state_prompts import StatePrompts
from rmsweb_jax.sampling.chat_model import ChatModel, default_stop_token_ids
from rmsweb_jax.sampling.sampler import rollout_params
from rmsweb_jax.stages import links
from rmsweb_jax.stages.manifest import MODEL_LOADING, TRAINER_CADENCE
from rmsweb_jax.stages.sft_split import saved_split
from rmsweb_jax.stages.train_overrides import with_train_overrides
from rmsweb_jax.train.loop import Trainer
from rmsweb_jax.train.loss import resolve_loss_impl
from rmsweb_jax.train.rl_loss import RLLossSettings, make_salvage_loss
from rmsweb_jax.train.settings import TrainSettings
from rmsweb_jax.train.step import ModelParts
from rmsweb_jax.train.tokenizer import check_tokenizer

# What the stage reads and writes (rmsweb_jax/stages/manifest.py decides from these whether it is up to date).
# sft's export unless salvage.init names another checkpoint; mine's state set unless salvage.states names a file.
# With salvage.grounding_rows > 0 it reads sft's split of config.data's store too (the ground stage's rows).
CONFIG_READS = ("salvage", "train", "data", "prompt", *MODEL_LOADING, "seed", "ground.kinds")
INPUT_STAGES = {"sft": "salvage.init", "mine": "salvage.states"}
OUTPUTS = {"salvage/summary.json": None, "salvage/hf": None}
FRESH_START = ("salvage",)  # a rerun for a change starts afresh (manifest.py)
NON_RESULT_FIELDS = TRAINER_CADENCE  # ... but not for a change of these alone

NAME = "salvage"


def check_config(config, workdir) -> tuple:
    """Returns (learner class, its settings, the loss's settings, the run's config: config.train with
    config.salvage.train over it) once they build and the batch holds a step's groups (no state set, checkpoint or
    model read); raises UserError naming the key. The pipeline calls it before any stage runs (stages/pipeline.py
    check_stages), run() as its first step."""
    cfg = config.salvage
    learner_type = learner_class(cfg.algorithm)
    settings = learner_type.settings_from_config(cfg)
    draw_settings = settings.draw
    loss_settings = RLLossSettings.from_config(cfg.loss)
    run_config = with_train_overrides(config, "salvage")  # config.salvage.train over config.train
    train = TrainSettings.from_config(run_config.train)  # the trainer's, as Trainer builds them
    if train.total_steps % settings.epochs:
        raise UserError(f"config.salvage.train.total_steps (or config.train.optimizer.total_steps) = "
                        f"{train.total_steps} is not a multiple of config.salvage.epochs = {settings.epochs}: the "
                        "run would end between the optimizer steps on one drawn batch, where it cannot checkpoint")
    batch_size = int(run_config.train.batch_size)
    if batch_size < draw_settings.groups_per_step * draw_settings.group_size:
        raise UserError(f"config.salvage.train.batch_size (or config.train.batch_size) = {batch_size} cannot hold "
                        f"config.salvage.groups_per_step x group_size = {draw_settings.groups_per_step} x "
                        f"{draw_settings.group_size} policy rows; raise the batch size or lower B or G")
    rows = cfg.grounding_rows
    if isinstance(rows, bool) or not isinstance(rows, int) or rows < 0:
        raise UserError(f"config.salvage.grounding_rows = {rows!r}: expected an int >= 0 (grounding anchor rows per "
                        "update, in the batch's spare rows; 0 = none)")
    if rows and loss_settings.anchor_weight == 0:
        raise UserError(f"config.salvage.grounding_rows = {rows} needs config.salvage.loss.anchor_weight > 0: "
                        "grounding rows are anchor rows, weighted by it")
    weight = cfg.grounding_weight
    if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not 0 < weight < float("inf"):
        raise UserError(f"config.salvage.grounding_weight = {weight!r}: expected a number > 0 (the loss weight of a "
                        "grounding anchor row's tool-call tokens, over the other anchor rows')")
    if rows:
        parse_kinds(config.ground.kinds)
    return learner_type, settings, loss_settings, run_config


def run(config, workdir: pathlib.Path) -> dict:
    """Trains Salvage-DS updates (config.salvage.train over config.train: total_steps, batch size, rate); writes
    summary.json."""

    workdir = storage.as_path(workdir)  # local, or gs:// (Orbax and the HF export write the bucket: train/loop.py)
    cfg = config.salvage
    # Settings and the state set first: a bad value or a missing state set fails before a model loads.
    learner_type, settings, loss_settings, run_config = check_config(config, workdir)
    batch_size = int(run_config.train.batch_size)
    states = StateSet(cfg.states or links.folder(workdir, "mine") / "states.arrayrecord")
    spec = cfg.init or f"hf:{links.folder(workdir, 'sft') / 'hf'}"
    if spec.startswith("hf:") and not (storage.user_path(spec[3:]) / "config.json").is_file():
        raise UserError(f"config.salvage.init {spec!r}: no HF checkpoint there (run the sft stage first, or "
                        "give hf:/path/to/checkpoint)")
    run_config.model.init = spec
    impl = resolve_loss_impl(config.train.loss_impl, mesh_from_config(config))
    trainer = Trainer(run_config, workdir, name=NAME, loss_fn=make_salvage_loss(loss_settings, impl))
    try:
        tokenizer, image_config = check_tokenizer(trainer.init_dir, trainer.model_config)
        pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        ref_params = None
        if loss_settings.kl_beta > 0:  # the frozen SFT policy: the run's init, whatever step we resume at
            ref_config = run_config.copy_and_resolve_references()
            ref_config.model.init = f"hf:{trainer.init_dir}"
            ref_params = ModelParts.split(load_model(ref_config, workdir)[0]).params
        chat = ChatModel(trainer.model(), tokenizer, name=NAME, image_config=image_config,
                         stop_token_ids=default_stop_token_ids(tokenizer, trainer.init_dir),
                         max_batch=int(cfg.sample_batch))
        params = rollout_params(trainer.model_config, cfg.max_new_tokens, cfg.temperature, cfg.top_p)
        buckets = Buckets(config.data.buckets, config.data.bucket_patches, image_config.patch_dim,
                          image_config.merge_size ** 2)
        prompt = prompt_config_from(config)
        grounding = None
        if cfg.grounding_rows:
            _, view, split, _ = saved_split(config, workdir)  # the pages sft trained on, never its held-out groups
            grounding = GroundingAnchors(GroundingRows(view, split.train, prompt, parse_kinds(config.ground.kinds)),
                                         cfg.grounding_rows, tokenizer, image_config, PromptBuilder(prompt),
                                         seed=int(cfg.seed), weight=float(cfg.grounding_weight))
        learner = learner_type(trainer, chat, StatePrompts(states, tokenizer, image_config, prompt), settings,
                               sampling=params, buckets=buckets, batch_size=batch_size, pad_id=pad_id,
                               ref_params=ref_params, grounding=grounding)
        trainer.writer.message(f"[salvage] {states!r}; init {trainer.init_dir}; {learner.describe()}")
        totals = learner.run()
        result = trainer.finish()
    finally:
        trainer.close()
        states.close()
    summary = {"steps": result.step, "resumed_from": result.resumed_from, "states": len(states),
               "init_dir": str(trainer.init_dir), "algorithm": learner.algorithm,
               "sampler_state": learner.sampler.get_state(),
               "this_run": totals, "last_metrics": result.last_metrics,
               "hf_dir": None if result.hf_dir is None else str(result.hf_dir)}
    if jax.process_index() == 0:
        storage.write_text_atomic(result.run_dir / "summary.json", json.dumps(summary, indent=2))
    print(f"[salvage] {result.step} steps; {totals['groups_accepted']} groups accepted from "
          f"{totals['states_drawn']} states drawn this run ({totals['shortfall']} short); checkpoints in "
          f"{result.run_dir / 'checkpoints'}" + (f"; HF export {result.hf_dir}" if result.hf_dir else ""))
    return summary
