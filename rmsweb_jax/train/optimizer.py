"""AdamW with linear warmup, cosine decay and global-norm clipping, built from `config.train.optimizer`."""
from __future__ import annotations

import dataclasses
from typing import Any

import jax
import optax
from rmsweb_jax.errors import UserError


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
    """The optimizer's hyper-parameters; `total_steps` is also the length of the run."""
    lr: float = 1e-5
    warmup_steps: int = 0
    total_steps: int = 1000
    end_lr_fraction: float = 0.0   # the cosine decays to lr * end_lr_fraction at total_steps
    weight_decay: float = 0.0
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8
    clip_norm: float = 1.0         # 0 or less: no clipping

    def __post_init__(self):
        _require(self.total_steps >= 1, "total_steps", "an integer >= 1", self.total_steps)
        _require(0 <= self.warmup_steps <= self.total_steps, "warmup_steps",
                 f"an integer in [0, total_steps={self.total_steps}]", self.warmup_steps)
        _require(self.lr >= 0, "lr", "a learning rate >= 0", self.lr)
        _require(0 <= self.end_lr_fraction <= 1, "end_lr_fraction", "a fraction in [0, 1]", self.end_lr_fraction)
        _require(self.weight_decay >= 0, "weight_decay", "a value >= 0", self.weight_decay)
        _require(0 <= self.b1 < 1 and 0 <= self.b2 < 1, "b1/b2", "values in [0, 1)", (self.b1, self.b2))
        _require(self.eps > 0, "eps", "a value > 0", self.eps)

    @classmethod
    def from_config(cls, cfg: Any) -> "OptimizerConfig":
        """Returns the config of `config.train.optimizer` (an ml_collections ConfigDict or a dict)."""
        known = {f.name for f in dataclasses.fields(cls)}
        values = dict(cfg)
        unknown = sorted(set(values) - known)
        if unknown:
            raise UserError(f"config.train.optimizer has unknown key(s) {unknown}; expected some of {sorted(known)}")
        return cls(**values)


def learning_rate_schedule(cfg: OptimizerConfig) -> optax.Schedule:
    """Returns lr(step): linear 0 -> lr over warmup_steps, then cosine to lr * end_lr_fraction at total_steps."""
    decay_steps = cfg.total_steps - cfg.warmup_steps
    cosine = optax.cosine_decay_schedule(cfg.lr, max(decay_steps, 1), alpha=cfg.end_lr_fraction)
    if cfg.warmup_steps == 0:
        return cosine
    warmup = optax.linear_schedule(0.0, cfg.lr, cfg.warmup_steps)
    return optax.join_schedules([warmup, cosine], [cfg.warmup_steps])


def make_optimizer(cfg: OptimizerConfig) -> optax.GradientTransformation:
    """Returns clip_by_global_norm(clip_norm) followed by AdamW on the warmup + cosine schedule.

    Weight decay is decoupled (scaled by the schedule, as in optax.adamw) and skips norm scales and
    biases, as transformers' Trainer does; by name, because stacked layers make every parameter >= 2-D.
    """
    adamw = optax.adamw(learning_rate_schedule(cfg), b1=cfg.b1, b2=cfg.b2, eps=cfg.eps,
                        weight_decay=cfg.weight_decay, mask=weight_decay_mask)
    if cfg.clip_norm and cfg.clip_norm > 0:
        return optax.chain(optax.clip_by_global_norm(cfg.clip_norm), adamw)
    return adamw


def weight_decay_mask(params):
    """Returns a pytree of bools like `params`: False for norm scales and biases (no weight decay)."""
    def decays(path, _):
        name = str(getattr(path[-1], "key", path[-1])) if path else ""
        return not ("norm" in name or "bias" in name)
    return jax.tree_util.tree_map_with_path(decays, params)


def _require(ok: bool, key: str, expected: str, got: Any) -> None:
    if not ok:
        raise UserError(f"config.train.optimizer.{key}: expected {expected}, got {got!r}")
