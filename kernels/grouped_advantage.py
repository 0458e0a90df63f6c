"""Grouped (GRPO-style) advantages and the Salvage-DS gate flags, in one pass.

Input: rewards [num_groups, G] and a validity mask (groups may be ragged). Output per group:
mean, std, count, the fraction of positive rewards, the advantages (r - mean) / (std + eps)
(or r - mean with std_normalize=False) and two gate flags that Salvage-DS dynamic sampling
uses to keep a group:

* contrast:   the group holds at least one positive and one non-positive valid member, and its
              reward std is above `contrast_std_min`. With +1/-1 rewards this is "not all the
              same outcome".
* competence: the group is non-empty and its fraction of positive members lies in
              [competence_min, competence_max] (both ends included).

A member is positive when its `correct` flag is set ([num_groups, G] bool, when given: Salvage-DS
passes whether each sample is the reference action, so the gates mean the same thing under any
reward, partial credit included), else when its reward > `positive_threshold` (default 0).

Numerics shared by both implementations: masked members may hold anything (NaN included),
they never reach a sum; the mean is taken around a pivot (the group's largest valid reward)
so an all-equal group gives exactly r - mean = 0, hence advantage 0 and std 0, never NaN;
empty groups give zeros and both flags False; std divides by max(count - ddof, 1).

The Pallas kernel lays groups on lanes ([G, num_groups] blocks, 128·k groups per block) so
a TPU vector register is full even when G = 8; members sit on sublanes, padded to 8.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from kernels import _dispatch

f32 = jnp.float32


class GroupStats(NamedTuple):
    """Per-group statistics; every field is [num_groups] except `advantages` [num_groups, G]."""

    mean: jax.Array
    std: jax.Array
    count: jax.Array  # valid members, float32
    advantages: jax.Array  # 0 at masked members
    competence_frac: jax.Array  # fraction of valid members that are positive (correct, or reward > threshold)
    contrast: jax.Array  # bool
    competence: jax.Array  # bool


@dataclasses.dataclass(frozen=True)
class Gates:
    """Static options of the computation (hashable: they are baked into the kernel)."""

    eps: float = 1e-6
    std_normalize: bool = True
    ddof: int = 0
    contrast_std_min: float = 0.0
    competence_min: float = 0.0
    competence_max: float = 1.0
    positive_threshold: float = 0.0  # a member is positive when reward > this (without `correct`)


def grouped_advantages(rewards, mask=None, *, correct=None, eps: float = 1e-6, std_normalize: bool = True,
                       ddof: int = 0, contrast_std_min: float = 0.0,
                       competence_min: float = 0.0, competence_max: float = 1.0,
                       positive_threshold: float = 0.0,
                       impl: str | None = None, block_groups: int | None = None) -> GroupStats:
    """Returns GroupStats for rewards [num_groups, G] (mask: True/nonzero = valid member).

    correct: [num_groups, G] bool (True/nonzero = the member counts as positive for contrast and
    competence); None: positive means reward > positive_threshold.

    impl: None (Pallas on TPU, "reference" on CPU and GPU), "reference", "pallas",
    "pallas_interpret". block_groups: groups per Pallas block (a multiple of 128 on TPU).
    Gradients w.r.t. rewards flow through every path (the Pallas one via custom_vjp).
    """
    rewards, valid = _validate(rewards, mask)
    correct_f = None if correct is None else _validate_correct(correct, rewards.shape)
    gates = Gates(float(eps), bool(std_normalize), int(ddof), float(contrast_std_min),
                  float(competence_min), float(competence_max), float(positive_threshold))
    _validate_gates(gates)
    launch = _dispatch.resolve(impl, allowed=("reference", "pallas", "pallas_interpret"),
                               cpu_default="reference")
    if launch.impl == "reference":
        arrays = _reference_arrays(rewards, valid.astype(f32), gates, correct_f)
    else:
        arrays = grouped_arrays_pallas(rewards, valid.astype(f32), gates, launch.platform,
                                       launch.interpret, block_groups, correct_f)
    return _to_stats(arrays)


def grouped_advantages_reference(rewards, mask=None, **gates) -> GroupStats:
    """Returns GroupStats computed by the pure-JAX reference (any backend, differentiable)."""
    return grouped_advantages(rewards, mask, impl="reference", **gates)


# ----------------------------------------------------------------------------- reference


@functools.partial(jax.jit, static_argnames=("gates",))
def _reference_arrays(r, valid_f, gates: Gates, correct_f=None):
    """Returns (mean, std, count, competence_frac, contrast, competence, advantages), all f32.

    correct_f: [N, G] float32 (1 = positive) or None (positive = reward > gates.positive_threshold).
    """
    valid = valid_f > 0.5
    r = jnp.where(valid, r, 0.0)
    count = jnp.sum(valid, axis=-1).astype(f32)
    denom = jnp.maximum(count, 1.0)
    # The pivot does not change the mean mathematically; it makes r - mean exact when all
    # valid rewards are equal. No gradient flows through it (d mean / d pivot = 0).
    pivot = jnp.max(jnp.where(valid, r, -jnp.inf), axis=-1)
    pivot = jax.lax.stop_gradient(jnp.where(count > 0, pivot, 0.0))
    mean = pivot + jnp.sum(jnp.where(valid, r - pivot[:, None], 0.0), axis=-1) / denom
    centered = jnp.where(valid, r - mean[:, None], 0.0)
    var = jnp.sum(centered * centered, axis=-1) / jnp.maximum(count - gates.ddof, 1.0)
    std = _safe_sqrt(var)
    adv = centered / (std[:, None] + gates.eps) if gates.std_normalize else centered
    positive = r > gates.positive_threshold if correct_f is None else correct_f > 0.5
    n_pos = jnp.sum(valid & positive, axis=-1).astype(f32)
    frac = n_pos / denom
    contrast = (n_pos > 0) & (n_pos < count) & (std > gates.contrast_std_min)
    competence = (count > 0) & (frac >= gates.competence_min) & (frac <= gates.competence_max)
    return (mean, std, count, frac, contrast.astype(f32), competence.astype(f32), adv)


def _safe_sqrt(x):
    """Returns sqrt(x) with a zero (not NaN) gradient at x = 0."""
    positive = x > 0
    return jnp.where(positive, jnp.sqrt(jnp.where(positive, x, 1.0)), 0.0)


# ----------------------------------------------------------------------------- Pallas

_STAT_ROWS = 8  # mean, std, count, frac, contrast, competence + 2 spare: one (8, 128) tile


def _group_kernel(r_ref, m_ref, *refs, gates: Gates, has_correct: bool):
    """One block: members on sublanes (axis 0), groups on lanes (axis 1). refs: (correct,)
    when has_correct, then the two outputs (stats, advantages)."""
    c_ref, stats_ref, adv_ref = refs if has_correct else (None, *refs)
    valid = m_ref[...] > 0.5
    r = jnp.where(valid, r_ref[...], 0.0)
    count = jnp.sum(jnp.where(valid, 1.0, 0.0), axis=0, keepdims=True)
    denom = jnp.maximum(count, 1.0)
    pivot = jnp.max(jnp.where(valid, r, -jnp.inf), axis=0, keepdims=True)
    pivot = jnp.where(count > 0, pivot, 0.0)
    mean = pivot + jnp.sum(jnp.where(valid, r - pivot, 0.0), axis=0, keepdims=True) / denom
    centered = jnp.where(valid, r - mean, 0.0)
    var = jnp.sum(centered * centered, axis=0, keepdims=True) / jnp.maximum(
        count - gates.ddof, 1.0)
    std = jnp.sqrt(var)
    positive = c_ref[...] > 0.5 if has_correct else r > gates.positive_threshold
    n_pos = jnp.sum(jnp.where(valid & positive, 1.0, 0.0), axis=0, keepdims=True)
    frac = n_pos / denom
    contrast = (n_pos > 0) & (n_pos < count) & (std > gates.contrast_std_min)
    competence = (count > 0) & (frac >= gates.competence_min) & (frac <= gates.competence_max)
    rows = (mean, std, count, frac, jnp.where(contrast, 1.0, 0.0),
            jnp.where(competence, 1.0, 0.0), jnp.zeros_like(mean), jnp.zeros_like(mean))
    for i, row in enumerate(rows):
        stats_ref[i:i + 1, :] = row
    adv_ref[...] = centered / (std + gates.eps) if gates.std_normalize else centered


def _block_layout(num_groups: int, group_size: int, platform: str, block_groups: int | None):
    """Returns (padded G, groups per block, padded num_groups) for the platform's tiling rules.

    TPU (Mosaic): the last two block dims must be multiples of (8, 128): members pad to a
    multiple of 8, groups per block to a multiple of 128. GPU (Triton): every block dim must
    be a power of two.
    """
    if platform == "gpu":
        g_pad = _dispatch.next_pow2(max(group_size, 8))
        default = max(16, min(512, 4096 // g_pad))  # keep a block's values in registers
        bn = _dispatch.next_pow2(block_groups or default)
        bn = min(bn, _dispatch.next_pow2(max(num_groups, 16)))
    else:
        g_pad = _dispatch.round_up(group_size, 8)
        bn = block_groups or 512
        if bn % 128:
            raise ValueError(f"block_groups must be a multiple of 128 on TPU, got {bn}")
        bn = min(bn, _dispatch.round_up(num_groups, 128))
    return g_pad, bn, _dispatch.round_up(num_groups, bn)


@functools.partial(jax.jit, static_argnums=(2, 3, 4, 5))
def _pallas_forward(r, valid_f, gates: Gates, platform: str, interpret: bool,
                    block_groups: int | None, correct_f=None):
    n, g = r.shape
    g_pad, bn, n_pad = _block_layout(n, g, platform, block_groups)
    # Transposed so groups land on lanes; padding is masked out (count 0 -> zeros).
    inputs = [r, valid_f] + ([] if correct_f is None else [correct_f])
    inputs = [jnp.pad(x.T, ((0, g_pad - g), (0, n_pad - n))) for x in inputs]
    spec = pl.BlockSpec((g_pad, bn), lambda i: (0, i))
    stats, adv = pl.pallas_call(
        functools.partial(_group_kernel, gates=gates, has_correct=correct_f is not None),
        grid=(n_pad // bn,),
        in_specs=[spec] * len(inputs),
        out_specs=[pl.BlockSpec((_STAT_ROWS, bn), lambda i: (0, i)), spec],
        out_shape=[jax.ShapeDtypeStruct((_STAT_ROWS, n_pad), f32),
                   jax.ShapeDtypeStruct((g_pad, n_pad), f32)],
        compiler_params=_compiler_params(platform),
        interpret=interpret,
        name="grouped_advantages",
    )(*inputs)
    return tuple(stats[i, :n] for i in range(6)) + (adv[:g, :n].T,)


def _compiler_params(platform: str):
    if platform == "gpu":
        from jax.experimental.pallas import triton as pltriton
        return pltriton.CompilerParams(num_warps=4, num_stages=1)
    from jax.experimental.pallas import tpu as pltpu
    return pltpu.CompilerParams(dimension_semantics=("parallel",))


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3, 4, 5))
def grouped_arrays_pallas(r, valid_f, gates: Gates, platform: str, interpret: bool,
                          block_groups: int | None, correct_f=None):
    """Returns the Pallas kernel's (mean, std, count, frac, contrast, competence, advantages).

    `platform` picks the block layout ("tpu" or "gpu"); with interpret=True either layout
    runs on CPU. r: [N, G] float32, valid_f: [N, G] float32 (1 = valid), correct_f: [N, G]
    float32 (1 = positive) or None (positive = reward > gates.positive_threshold).
    """
    return _pallas_forward(r, valid_f, gates, platform, interpret, block_groups, correct_f)


def _pallas_fwd(r, valid_f, gates, platform, interpret, block_groups, correct_f):
    out = _pallas_forward(r, valid_f, gates, platform, interpret, block_groups, correct_f)
    return out, (r, valid_f, correct_f)


def _pallas_bwd(gates, platform, interpret, block_groups, residuals, cotangents):
    # The backward is cheap elementwise math over [N, G]: the reference's VJP is exact.
    r, valid_f, correct_f = residuals
    _, vjp = jax.vjp(lambda x: _reference_arrays(x, valid_f, gates, correct_f), r)
    (d_r,) = vjp(cotangents)
    return d_r, jnp.zeros_like(valid_f), None if correct_f is None else jnp.zeros_like(correct_f)


grouped_arrays_pallas.defvjp(_pallas_fwd, _pallas_bwd)


# ----------------------------------------------------------------------------- helpers


def _to_stats(arrays) -> GroupStats:
    mean, std, count, frac, contrast, competence, adv = arrays
    return GroupStats(mean=mean, std=std, count=count, advantages=adv, competence_frac=frac,
                      contrast=contrast > 0.5, competence=competence > 0.5)


def _validate(rewards, mask):
    rewards = jnp.asarray(rewards)
    if rewards.ndim != 2:
        raise ValueError(f"rewards must be [num_groups, G], got shape {rewards.shape}")
    if not jnp.issubdtype(rewards.dtype, jnp.floating):
        rewards = rewards.astype(f32)
    if mask is None:
        valid = jnp.ones(rewards.shape, bool)
    else:
        mask = jnp.asarray(mask)
        if mask.shape != rewards.shape:
            raise ValueError(f"mask shape {mask.shape} must equal rewards shape {rewards.shape}")
        valid = mask.astype(bool)
    return rewards.astype(f32), valid


def _validate_correct(correct, shape) -> jax.Array:
    correct = jnp.asarray(correct)
    if correct.shape != tuple(shape):
        raise ValueError(f"correct shape {correct.shape} must equal rewards shape {tuple(shape)}")
    return correct.astype(bool).astype(f32)


def _validate_gates(gates: Gates) -> None:
    if gates.eps < 0:
        raise ValueError(f"eps must be >= 0, got {gates.eps}")
    if gates.ddof not in (0, 1):
        raise ValueError(f"ddof must be 0 or 1, got {gates.ddof}")
    if gates.competence_min > gates.competence_max:
        raise ValueError(f"competence_min ({gates.competence_min}) must be <= "
                         f"competence_max ({gates.competence_max})")
