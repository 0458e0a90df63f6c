"""The trainer's settings, read once from `config.train` and validated (errors name the config key)."""
from __future__ import annotations

import dataclasses
from typing import Any

from rmsweb_jax.errors import UserError
from rmsweb_jax.train.loss import LOSS_IMPLS
from rmsweb_jax.train.optimizer import OptimizerConfig
from rmsweb_jax.train.profiling import parse_profile_steps


@dataclasses.dataclass(frozen=True)
class TrainSettings:
    batch_size: int                 # global rows per step (all processes, all microbatches)
    microbatches: int               # gradient accumulation: the step scans this many slices of the batch
    optimizer: OptimizerConfig      # optimizer.total_steps is the run's length
    checkpoint_every: int
    checkpoint_keep: int
    checkpoint_async: bool
    metrics_every: int
    peak_tflops: float              # per device; 0 = look it up (accelerators) or measure (CPU)
    export_hf: bool
    loss_impl: str
    profile_steps: tuple[int, int] | None  # a jax.profiler trace of these steps (inclusive); None = no trace
    wandb_project: str              # "" = no Weights & Biases run

    def __post_init__(self):
        for key, value in (("batch_size", self.batch_size), ("microbatches", self.microbatches),
                           ("checkpoint.every_steps", self.checkpoint_every), ("checkpoint.keep", self.checkpoint_keep),
                           ("metrics.every_steps", self.metrics_every)):
            if not isinstance(value, int) or value < 1:
                raise UserError(f"config.train.{key} = {value!r}: expected an integer >= 1")
        if self.loss_impl not in LOSS_IMPLS:
            raise UserError(f"config.train.loss_impl = {self.loss_impl!r}: expected one of {LOSS_IMPLS}")

    @property
    def total_steps(self) -> int:
        return self.optimizer.total_steps

    @classmethod
    def from_config(cls, train: Any) -> "TrainSettings":
        """Returns the settings of `config.train` (see configs/common.py for the fields)."""
        if train is None:
            raise UserError("config has no 'train' block (see configs/common.py)")
        try:
            return cls(batch_size=train.batch_size, microbatches=train.microbatches,
                       optimizer=OptimizerConfig.from_config(train.optimizer),
                       checkpoint_every=train.checkpoint.every_steps, checkpoint_keep=train.checkpoint.keep,
                       checkpoint_async=bool(train.checkpoint.async_save), metrics_every=train.metrics.every_steps,
                       peak_tflops=float(train.metrics.peak_tflops), export_hf=bool(train.export_hf),
                       loss_impl=train.loss_impl, profile_steps=parse_profile_steps(train.profile_steps),
                       wandb_project=str(train.metrics.wandb))
        except (AttributeError, KeyError) as e:
            raise UserError(f"config.train is missing a field: {e} (see configs/common.py for the full block)") from e
