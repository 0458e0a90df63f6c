"""A loss's metric terms, and their exact reduction over microbatches, devices and the steps of a report.

A loss function returns (LossParts, aux); aux maps a metric name to one of:

  Mean(numerator, denominator)  reported as sum(numerator) / sum(denominator) over every microbatch and
                                every step of a report window. Exact: a mean of per-microbatch means would
                                weight a microbatch of 3 tokens like one of 3,000. Not reported while the
                                summed denominator is 0 (nothing to average, e.g. no policy tokens).
  Min(value) / Max(value)       reported as the min / max over them; a sum of minima means nothing, so they
                                get their own reduction. A microbatch with nothing to measure gives the
                                identity (+inf for Min, -inf for Max); a window that stays infinite is not
                                reported.
  a plain scalar                a per-step total (e.g. a count): summed over microbatches, averaged over the
                                steps of the window.

Inside the jitted step the batch is one global array over the mesh, so a loss's jnp.sum / jnp.min /
jnp.max over a microbatch already covers every device and process; what remains is the microbatch
axis of the step's scan (`reduce_microbatches`) and the steps of a window on the host (`combine`,
`resolve`).
"""
from __future__ import annotations

import math
from typing import Any, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np


class Mean(NamedTuple):
    """A ratio metric: reported as sum(numerator) / sum(denominator)."""
    numerator: Any
    denominator: Any


class Min(NamedTuple):
    """A minimum (identity +inf)."""
    value: Any


class Max(NamedTuple):
    """A maximum (identity -inf)."""
    value: Any


def _is_term(x) -> bool:
    return isinstance(x, (Mean, Min, Max))


def reduce_microbatches(aux: dict) -> dict:
    """Returns aux reduced over the leading microbatch axis of each leaf (what the step's scan stacked)."""
    def reduce(x):
        if isinstance(x, Mean):
            return Mean(jnp.sum(x.numerator, axis=0), jnp.sum(x.denominator, axis=0))
        if isinstance(x, Min):
            return Min(jnp.min(x.value, axis=0))
        if isinstance(x, Max):
            return Max(jnp.max(x.value, axis=0))
        return jnp.sum(x, axis=0)
    return jax.tree.map(reduce, aux, is_leaf=_is_term)


def to_host(aux: dict) -> dict:
    """Returns a step's reduced aux with Python floats (waits for the device)."""
    return jax.tree.map(float, jax.device_get(aux))


def combine(steps: Sequence[dict]) -> dict:
    """Returns the host aux of several steps combined (Mean: sums; Min / Max: min / max; plain: mean)."""
    out: dict[str, Any] = {}
    for name in dict.fromkeys(k for s in steps for k in s):
        values = [s[name] for s in steps if name in s]
        first = values[0]
        if isinstance(first, Mean):
            out[name] = Mean(sum(v.numerator for v in values), sum(v.denominator for v in values))
        elif isinstance(first, Min):
            out[name] = Min(min(v.value for v in values))
        elif isinstance(first, Max):
            out[name] = Max(max(v.value for v in values))
        else:
            out[name] = float(np.mean(values))
    return out


def resolve(aux: dict) -> dict[str, float]:
    """Returns {name: value} to report: Mean as numerator / denominator; empty ones left out."""
    out = {}
    for name, v in aux.items():
        if isinstance(v, Mean):
            if v.denominator != 0:
                out[name] = float(v.numerator) / float(v.denominator)
        elif isinstance(v, (Min, Max)):
            if math.isfinite(v.value):
                out[name] = float(v.value)
        else:
            out[name] = float(v)
    return out
