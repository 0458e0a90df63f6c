"""Meshes and logical-axis sharding: one rules table maps logical names to mesh axes.

Parameters carry logical axis names in their `axes` metadata (e.g. ("layers", "embed", "mlp"));
activations are constrained with `constrain(x, ("batch", "seq", "embed"), mesh, rules)`. The rules table
lives in the config (`config.sharding_rules`), so changing the parallelism layout is a config edit.
"""
from __future__ import annotations

from typing import Any, Iterable, Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

MESH_AXES = ("data", "fsdp", "tensor")

# (logical name, mesh axis or tuple of mesh axes or None). First match wins; a mesh axis is used
# at most once per array (later logical dims that map to an already-used mesh axis stay replicated).
DEFAULT_RULES: tuple[tuple[str, Any], ...] = (
    ("batch", ("data", "fsdp")),
    ("seq", None),
    ("kv_seq", None),
    ("layers", None),
    ("vocab", "tensor"),
    ("embed", "fsdp"),
    ("mlp", "tensor"),
    ("q_heads", "tensor"),
    ("kv_heads", "tensor"),
    ("head_dim", None),
    ("norm", None),
    ("patch", None),
    ("vision_embed", "fsdp"),
    ("vision_mlp", "tensor"),
    ("vision_heads", "tensor"),
    ("merged", "tensor"),
    ("pos_table", None),
    ("patches", None),
)


def make_mesh(shape: Sequence[int], axis_names: Sequence[str] = MESH_AXES, devices=None) -> Mesh:
    """Returns a Mesh of `shape` over the given (default: all) devices, axis names ('data','fsdp','tensor')."""
    devices = jax.devices() if devices is None else list(devices)
    need = int(np.prod(shape))
    if len(shape) != len(axis_names):
        raise ValueError(f"mesh shape {tuple(shape)} has {len(shape)} axes but names are {tuple(axis_names)}")
    if need != len(devices):
        raise ValueError(f"mesh shape {tuple(shape)} needs {need} devices, {len(devices)} available")
    return Mesh(np.asarray(devices).reshape(tuple(shape)), tuple(axis_names))


def logical_to_spec(axes: Iterable[str | None] | None, rules=DEFAULT_RULES, mesh: Mesh | None = None,
                    shape: Sequence[int] | None = None) -> PartitionSpec:
    """Returns the PartitionSpec for logical `axes` under `rules` (mesh axes used at most once).

    With `mesh` and `shape`, a dimension is left replicated when the mesh axes do not divide it,
    so odd-sized tensors (tiny test models, vocab tails) still place.
    """
    if axes is None:
        return PartitionSpec()
    table = {name: target for name, target in rules}
    used: set[str] = set()
    out = []
    for dim, name in enumerate(axes):
        target = table.get(name) if name is not None else None
        if target is None:
            out.append(None)
            continue
        targets = (target,) if isinstance(target, str) else tuple(target)
        targets = tuple(t for t in targets if t not in used and (mesh is None or t in mesh.shape))
        if mesh is not None:
            targets = tuple(t for t in targets if mesh.shape[t] > 1)
        if mesh is not None and shape is not None and targets:
            size = int(np.prod([mesh.shape[t] for t in targets]))
            if shape[dim] % size:
                targets = ()
        used.update(targets)
        out.append(None if not targets else targets[0] if len(targets) == 1 else targets)
    return PartitionSpec(*out)


def named_sharding(mesh: Mesh, axes, rules=DEFAULT_RULES, shape=None) -> NamedSharding:
    """Returns a NamedSharding on `mesh` for logical `axes`."""
    return NamedSharding(mesh, logical_to_spec(axes, rules, mesh, shape))


def constrain(x: jax.Array, axes, mesh: Mesh | None, rules=DEFAULT_RULES) -> jax.Array:
    """Returns `x` with a sharding constraint for logical `axes` (a no-op without a mesh)."""
    if mesh is None or mesh.size == 1:
        return x
    return jax.lax.with_sharding_constraint(x, named_sharding(mesh, axes, rules, x.shape))


def rules_from_config(rules) -> tuple[tuple[str, Any], ...]:
    """Returns a rules table from a config value (list of [name, target] pairs, e.g. from ml_collections)."""
    if rules is None:
        return DEFAULT_RULES
    out = []
    for i, pair in enumerate(rules):
        if len(pair) != 2 or not isinstance(pair[0], str):
            raise ValueError(f"sharding_rules[{i}] = {pair!r}: expected (logical_name, mesh_axis_or_axes_or_None)")
        target = pair[1]
        if isinstance(target, list):
            target = tuple(target)
        for t in (target,) if isinstance(target, (str, type(None))) else target:
            if t is not None and t not in MESH_AXES:
                raise ValueError(f"sharding_rules[{i}] = {pair!r}: unknown mesh axis {t!r}; expected {MESH_AXES}")
        out.append((pair[0], target))
    return tuple(out)


# ---- the sampler's decode layout ---------------------------------------------------------------------
# Logical names of the parameters' dimensions that the decode layouts take off their mesh axes. A decode step
# multiplies a few rows by every weight once, so weights sharded over FSDP would be all-gathered on every
# generated token; the decode copy keeps each weight whole on its devices instead ("tensor": split only over
# the heads/MLP/vocabulary axis, one all-reduce of activations per layer; "replicated": every weight whole on
# every device, rows split over the batch axes and no collective at all).
DECODE_SHARDINGS = ("auto", "training", "tensor", "replicated")
_OFF_FSDP = ("embed", "vision_embed")
_OFF_TENSOR = ("vocab", "mlp", "q_heads", "kv_heads", "vision_mlp", "vision_heads", "merged")
# "auto" replicates the decode copy when it takes at most this share of a device's memory: the rest holds the
# training state, the KV cache and the prefill (the planner counts each, plan/memory.py).
AUTO_REPLICATED_SHARE = 0.25


def decode_rules(rules, layout: str) -> tuple[tuple[str, Any], ...]:
    """Returns the rules table of a decode layout ('training' keeps `rules`; module comment above)."""
    if layout not in DECODE_SHARDINGS[1:]:
        raise ValueError(f"decode sharding {layout!r}: expected one of {DECODE_SHARDINGS[1:]}")
    if layout == "training":
        return tuple(rules)
    off = _OFF_FSDP + (_OFF_TENSOR if layout == "replicated" else ())
    return tuple((name, None if name in off else target) for name, target in rules)


def pick_decode_sharding(layout: str, mesh: Mesh | None, copy_bytes: int, device_bytes: int | None) -> str:
    """Returns the decode layout `layout` resolves to: 'auto' is 'training' without a multi-device mesh,
    'replicated' when the copy fits AUTO_REPLICATED_SHARE of `device_bytes` (unknown: never), else 'tensor'."""
    if layout not in DECODE_SHARDINGS:
        raise ValueError(f"decode sharding {layout!r}: expected one of {DECODE_SHARDINGS}")
    if layout != "auto":
        return layout
    if mesh is None or mesh.size == 1:
        return "training"
    if device_bytes and copy_bytes <= AUTO_REPLICATED_SHARE * device_bytes:
        return "replicated"
    return "tensor"
