"""The Salvage-DS loss: clipped importance-ratio surrogate on policy rows, action-only anchor NLL on anchor rows.

A Salvage-DS batch holds one sequence per row (train/batch.py contract), of two kinds:

  policy rows  prompt + one sampled response; loss_mask 1 on the response tokens; extras
               advantage [B] (the sample's group advantage), token_old_logprobs [B, L] (log p of each
               sampled token under the policy that sampled it, from the trainer's own forward pass),
               token_ref_logprobs [B, L] (the frozen SFT policy's; read only when kl_beta > 0).
  anchor rows  prompt + the reference turn; loss_mask 1 on the <tool_call>...</tool_call> tokens only;
               extra anchor [B] = 1.0 (0.0 on policy rows).

Per weighted token t (weight w_t = the shifted loss_mask), with logp_t the current log-prob:

  policy:  r_t = exp(logp_t - old_t);  term_t = -min(r_t A, clip(r_t, 1 - clip_low, 1 + clip_high) A)
           + kl_beta * k3_t,  k3_t = exp(ref_t - logp_t) - (ref_t - logp_t) - 1   (PPO / DAPO form)
  anchor:  term_t = anchor_weight * -logp_t

Aggregation (the LossParts denominator is the loss's, never a sum of signed advantages):
  token_mean                 sum_t w_t term_t / sum_t w_t over every weighted token of the batch
  sequence_mean_token_mean   each row's token mean, averaged over the rows with weighted tokens
Both stay exact under gradient accumulation: the numerator and the denominator are sums over rows.

Gradient: at ratio 1 the surrogate's gradient is -A * grad logp, the advantage-weighted NLL's. Outside
the trust region on the side the advantage pushes (A > 0 and r > 1 + clip_high, or A < 0 and
r < 1 - clip_low) the clipped term is the minimum and constant: zero gradient.

Log-probs come from kernels.token_logprobs (chunked on CPU/GPU, Pallas on TPU), whose custom VJP
gives exact gradients of any function of them. The CPU SFT path "fused" (kernels.weighted_nll_fused)
is not usable here: it computes the gradient of a weighted NLL with *constant* weights in the
forward pass, while the surrogate's per-token weight (r_t A, or 0 when clipped) depends on the
log-prob being differentiated. "fused" therefore runs the chunked kernel.

Metrics (aux, train/aux_metrics.py): policy_loss (token mean of the surrogate on policy tokens),
anchor_loss (token mean of the anchor NLL, before anchor_weight), kl (token mean of k3; only with
token_ref_logprobs), clip_fraction_low / clip_fraction_high (share of policy tokens whose gradient
the lower / upper bound cut), ratio_mean, ratio_min, ratio_max over policy tokens, and the counts
policy_tokens, anchor_tokens, policy_rows, anchor_rows per step.
"""
from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from kernels.token_logprobs import token_logprobs
from rmsweb_jax.errors import UserError
from rmsweb_jax.train.aux_metrics import Max, Mean, Min
from rmsweb_jax.train.loss import LossFn, LossParts, loss_head

AGGREGATIONS = ("token_mean", "sequence_mean_token_mean")
REQUIRED_EXTRAS = ("advantage", "anchor", "token_old_logprobs")
LOG_RATIO_LIMIT = 20.0


@dataclasses.dataclass(frozen=True)
class RLLossSettings:
    """config.salvage.loss, validated: the surrogate's trust region, aggregation, KL and anchor weights."""
    clip_low: float       # epsilon_low: the ratio's lower bound is 1 - clip_low
    clip_high: float      # epsilon_high: the upper bound is 1 + clip_high (DAPO: clip_high > clip_low)
    aggregation: str      # token_mean | sequence_mean_token_mean
    kl_beta: float        # weight of the k3 KL to the reference policy (0: off, token_ref_logprobs unread)
    anchor_weight: float  # lambda of the action-only anchor NLL

    def __post_init__(self):
        for name in ("clip_low", "clip_high", "kl_beta", "anchor_weight"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not value >= 0 \
                    or value == float("inf"):
                raise UserError(f"config.salvage.loss.{name} = {value!r}: expected a finite number >= 0")
            object.__setattr__(self, name, float(value))
        if self.clip_low >= 1:
            raise UserError(f"config.salvage.loss.clip_low = {self.clip_low}: expected < 1 (the ratio's lower "
                            "bound 1 - clip_low must stay positive)")
        if self.aggregation not in AGGREGATIONS:
            raise UserError(f"config.salvage.loss.aggregation = {self.aggregation!r}: expected one of "
                            f"{AGGREGATIONS}")

    @classmethod
    def from_config(cls, loss) -> "RLLossSettings":
        """Returns the settings of config.salvage.loss (every field required; defaults in configs/common.py)."""
        missing = [f.name for f in dataclasses.fields(cls) if f.name not in loss]
        if missing:
            raise UserError(f"config.salvage.loss lacks {missing}; see configs/common.py for the defaults")
        return cls(**{f.name: loss[f.name] for f in dataclasses.fields(cls)})


def salvage_terms(logp, weights, extras, settings: RLLossSettings) -> tuple[LossParts, dict]:
    """Returns (LossParts, aux) of the Salvage-DS loss from log-probs [b, L] of a microbatch's targets.

    weights [b, L] (the shifted loss_mask), extras as TrainBatch.extras (token_* ones shifted like weights).
    """
    missing = [k for k in REQUIRED_EXTRAS if k not in extras]
    if missing:
        raise ValueError(f"the Salvage-DS loss needs batch extras {list(REQUIRED_EXTRAS)}; missing {missing} "
                         f"(got {sorted(extras)}); see rmsweb_jax/train/rl_loss.py")
    if settings.kl_beta > 0 and "token_ref_logprobs" not in extras:
        raise UserError(f"config.salvage.loss.kl_beta = {settings.kl_beta} needs batch extra 'token_ref_logprobs' "
                        "(the reference policy's log-probs); set kl_beta = 0 or provide them")
    f32 = jnp.float32
    w = weights.astype(f32)
    is_anchor = (extras["anchor"].astype(f32) != 0)[:, None]
    on = w != 0
    policy, anchor = on & ~is_anchor, on & is_anchor
    w_policy, w_anchor = jnp.where(policy, w, 0.0), jnp.where(anchor, w, 0.0)
    adv = extras["advantage"].astype(f32)[:, None]
    # where() keeps garbage log-probs of unweighted positions (padding) out of exp() and of the gradient.
    safe_logp = jnp.where(on, logp, 0.0)
    old = jnp.where(policy, extras["token_old_logprobs"].astype(f32), 0.0)
    # Clamped (as verl does) so that a wildly stale token cannot make exp() inf and inf * 0 a NaN. A ratio
    # past e^+-20 is far outside any trust region; there the clamp's zero gradient replaces a huge one.
    log_ratio = jnp.where(policy, jnp.clip(safe_logp - old, -LOG_RATIO_LIMIT, LOG_RATIO_LIMIT), 0.0)
    ratio = jnp.exp(log_ratio)
    clipped = jnp.clip(ratio, 1.0 - settings.clip_low, 1.0 + settings.clip_high)
    surrogate = -jnp.minimum(ratio * adv, clipped * adv)
    term = jnp.where(policy, surrogate, 0.0)
    aux = {}
    if "token_ref_logprobs" in extras:
        ref = jnp.where(policy, extras["token_ref_logprobs"].astype(f32), 0.0)
        d = jnp.where(policy, ref - safe_logp, 0.0)
        k3 = jnp.expm1(d) - d
        if settings.kl_beta > 0:
            term = term + settings.kl_beta * k3
        aux["kl"] = Mean(jnp.sum(w_policy * k3), jnp.sum(w_policy))
    nll = jnp.where(anchor, -safe_logp, 0.0)
    term = term + settings.anchor_weight * nll
    weighted = w * term
    if settings.aggregation == "token_mean":
        parts = LossParts(jnp.sum(weighted), jnp.sum(w_policy + w_anchor))
    else:
        row_weight = jnp.sum(w_policy + w_anchor, axis=-1)
        has = row_weight != 0
        row_mean = jnp.where(has, jnp.sum(weighted, axis=-1) / jnp.where(has, row_weight, 1.0), 0.0)
        parts = LossParts(jnp.sum(row_mean), jnp.sum(has.astype(f32)))
    count = jnp.sum(policy.astype(f32))
    cut_low = policy & (adv < 0) & (ratio < 1.0 - settings.clip_low)
    cut_high = policy & (adv > 0) & (ratio > 1.0 + settings.clip_high)
    aux.update({
        "policy_loss": Mean(jnp.sum(w_policy * surrogate), jnp.sum(w_policy)),
        "anchor_loss": Mean(jnp.sum(w_anchor * nll), jnp.sum(w_anchor)),
        "clip_fraction_low": Mean(jnp.sum(cut_low.astype(f32)), count),
        "clip_fraction_high": Mean(jnp.sum(cut_high.astype(f32)), count),
        "ratio_mean": Mean(jnp.sum(jnp.where(policy, ratio, 0.0)), count),
        "ratio_min": Min(jnp.min(jnp.where(policy, ratio, jnp.inf))),
        "ratio_max": Max(jnp.max(jnp.where(policy, ratio, -jnp.inf))),
        "policy_tokens": count,
        "anchor_tokens": jnp.sum(anchor.astype(f32)),
        "policy_rows": jnp.sum(jnp.any(policy, axis=-1).astype(f32)),
        "anchor_rows": jnp.sum(jnp.any(anchor, axis=-1).astype(f32)),
    })
    return parts, aux


def make_salvage_loss(settings: RLLossSettings, impl: str | None = None) -> LossFn:
    """Returns the Salvage-DS loss_fn(model, microbatch) -> (LossParts, aux) (see the module docstring).

    impl: as resolve_loss_impl gives it; "fused" runs the chunked kernel (the surrogate's weights are not
    constants, see above).
    """
    impl = "chunked" if impl == "fused" else impl

    def salvage_loss(model, batch):
        hidden, _ = model.hidden_states(batch.inputs)
        lm_head, layout = loss_head(model, hidden)
        logp = token_logprobs(hidden, lm_head, batch.targets, impl=impl, **layout)
        return salvage_terms(logp, batch.weights, batch.extras, settings)

    return salvage_loss
