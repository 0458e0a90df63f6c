"""The shared training loop (SFT now, Salvage-DS later): batches in, sharded AdamW steps, Orbax checkpoints.

Modules, one job each:
  batch       the batch contract (below) and its host-side preparation and device placement
  image_batch which images belong to which row; a microbatch's padded vision inputs
  global_images  several processes: every process gathers all images and builds the global vision inputs
  loss        token-weighted losses as (sum, denominator); the SFT cross-entropy
  rl_loss     Salvage-DS: clipped importance-ratio surrogate + action-only anchor NLL (+ k3 KL), with metrics
  aux_metrics a loss's metric terms (Mean / Min / Max) and their exact reduction over microbatches and steps
  logprobs    forward-only log p(target | prefix) per token of a batch (mining, RL's old/reference log-probs)
  optimizer   AdamW + linear warmup + cosine decay + global-norm clipping from config.train.optimizer
  step        TrainState, shardings, the jitted step (microbatch scan, exact accumulation)
  checkpoint  Orbax CheckpointManager: train state + data-iterator state + metadata per step
  metrics     MFU FLOP count; TensorBoard / metrics.jsonl / console writer
  loop        Trainer: init or restore, step, report, checkpoint, NaN stop, HF export; Trainer.fit
  settings    config.train read and validated once
  synthetic_batches  deterministic in-memory batches (tests, the train_smoke stage)
  feeds       which processes feed the same rows of the batch (a tensor group over several hosts)

The batch contract. A data pipeline yields, per step, a dict of numpy arrays holding this process's feed's
B = config.train.batch_size / Trainer.feeds.count rows of L tokens (fixed L per length bucket; a feed is the
processes whose devices hold the same rows, feeds.py):

  input_ids       int   [B, L]  token ids
  segment_ids     int   [B, L]  0 = padding; 1, 2, ... = sequences packed into the row
                                (or attention_mask [B, L] 0/1: one sequence per row)
  loss_mask       float [B, L]  weight of token t AS A TARGET: position t-1 predicts input_ids[t] and
                                that prediction is weighted by loss_mask[t]; 0 at t = 0, on padding and
                                on the first token of each packed sequence
  pixel_values    float [P, D]  optional: all images' patches in the order of their image tokens,
                                padded with zero rows to a fixed P (a multiple of merge_size**2)
  image_grid_thw  int   [N, 3]  optional, with pixel_values: each image's (t, h, w) grid
  token_<name>    float [B, L]  optional per-token fields aligned like loss_mask (value at t belongs to token
                                t as a target; finite; 0 at padding), shifted with the targets into
                                TrainBatch.extras, e.g. token_old_logprobs, token_ref_logprobs (Salvage-DS)
  any other key   [B, ...]      per-row fields carried unchanged to the loss (TrainBatch.extras), e.g. advantage

MRoPE position ids are computed by the trainer (host side, per packed sequence, as transformers'
get_rope_index); the pipeline does not supply them. A batch source is an iterator of such dicts
with get_state() (a JSON value or bytes, describing the position after the batch just returned)
and set_state(state): the state is saved with every checkpoint and restored on resume.
"""
from rmsweb_jax.train.batch import TrainBatch, check_batch_layout, prepare_batch, to_global
from rmsweb_jax.train.checkpoint import Checkpointer, Restored
from rmsweb_jax.train.loop import BatchSource, NonFiniteError, Trainer, TrainResult
from rmsweb_jax.train.loss import LossParts, make_sft_loss, token_cross_entropy
from rmsweb_jax.train.optimizer import OptimizerConfig, learning_rate_schedule, make_optimizer
from rmsweb_jax.train.rl_loss import RLLossSettings, make_salvage_loss
from rmsweb_jax.train.settings import TrainSettings
from rmsweb_jax.train.step import ModelParts, TrainState, TrainStep
from rmsweb_jax.train.synthetic_batches import SyntheticBatches, random_examples
