"""Meshes and logical-axis sharding: one rules table maps logical names to mesh axes.

Parameters carry logical axis names in their `axes` metadata (e.g. ("layers", "embed", "mlp"));
activations are constrained with `constrain(x, ("batch", "seq", "embed"), mesh, rules)`. The rules table
lives in the config (`config.sharding_rules`), so changing the parallelism layout is a config edit.
"""
from __future__ import annotations

import dataclasses
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
# the heads/MLP/vocabulary axis, rows over the batch axes, two all-reduces of activations a layer; "replicated":
# every weight whole on every device, rows over every mesh axis so that no two devices decode the same row).
DECODE_SHARDINGS = ("auto", "training", "tensor", "replicated")
_OFF_FSDP = ("embed", "vision_embed")
_OFF_TENSOR = ("vocab", "mlp", "q_heads", "kv_heads", "vision_mlp", "vision_heads", "merged")
# "auto" considers the replicated copy only when it takes at most this share of a device's memory: the rest holds
# the training state, the KV cache and the prefill (the planner counts each, plan/memory.py).
AUTO_REPLICATED_SHARE = 0.25


def decode_rules(rules, layout: str) -> tuple[tuple[str, Any], ...]:
    """Returns the rules table of a decode layout ('training' keeps `rules`; module comment above)."""
    if layout not in DECODE_SHARDINGS[1:]:
        raise ValueError(f"decode sharding {layout!r}: expected one of {DECODE_SHARDINGS[1:]}")
    if layout == "training":
        return tuple(rules)
    off = _OFF_FSDP + (_OFF_TENSOR if layout == "replicated" else ())
    out = []
    for name, target in rules:
        if name == "batch" and layout == "replicated":  # whole weights everywhere: the rows take every axis
            given = () if target is None else (target,) if isinstance(target, str) else tuple(target)
            target = given + tuple(a for a in MESH_AXES if a not in given)
        out.append((name, None if name in off else target))
    return tuple(out)


def split_size(mesh: Mesh, entry) -> int:
    """Returns how many ways a PartitionSpec entry (None, a mesh axis or a tuple of them) splits its dimension."""
    axes = () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)
    return int(np.prod([mesh.shape[a] for a in axes]))


def row_shards(mesh: Mesh | None, rules) -> int:
    """Returns how many ways `rules` split rows (the 'batch' axes) on `mesh` (1 without one)."""
    if mesh is None:
        return 1
    return split_size(mesh, logical_to_spec(("batch",), rules, mesh)[0])


@dataclasses.dataclass(frozen=True)
class Bandwidth:
    """What a decode step's time is made of on one device: bytes streamed from memory, and collectives."""
    memory_bytes_per_s: float  # HBM (host memory on CPU): the weights and KV cache a step reads
    link_bytes_per_s: float    # chip-to-chip, per chip (ICI; NVLink)
    hop_s: float               # latency of one step of a ring collective


# Vendor figures, read 2026-12: HBM bandwidth per chip from cloud.google.com/tpu/docs/{v5e,v5p,v6e} (819, 2,765,
# 1,640 GBps) and the H100 SXM / H200 SXM datasheets (3.35, 4.8 TB/s); links as plan/chips.py (ICI 1,600, 4,800,
# 3,584 Gbps; NVLink 900 GB/s). Hop latency: 1 us on ICI (the figure ASTRA-Sim's TPU validation was given by the
# TPU team), assumed 3 us on NVLink.
BANDWIDTHS = {
    "v5e": Bandwidth(819e9, 1600e9 / 8, 1e-6),
    "v5p": Bandwidth(2765e9, 4800e9 / 8, 1e-6),
    "v6e": Bandwidth(1640e9, 3584e9 / 8, 1e-6),
    "h100": Bandwidth(3.35e12, 900e9, 3e-6),
    "h200": Bandwidth(4.8e12, 900e9, 3e-6),
}
# Any other device (host CPUs): memory shared by every device, and XLA:CPU's collectives meet in a rendezvous
# between threads (tens of microseconds): assumed figures, so small models replicate there.
DEFAULT_BANDWIDTH = Bandwidth(20e9, 20e9, 20e-6)


def chip_of(device_kind: str) -> str | None:
    """Returns the BANDWIDTHS name of a JAX `device_kind` ('TPU v5' is a v5p, 'TPU v6 lite' a v6e), else None."""
    kind = device_kind.lower()
    for name, marks in (("v5e", ("v5 lite", "v5e")), ("v6e", ("v6 lite", "v6e")), ("v5p", ("tpu v5",)),
                        ("h100", ("h100",)), ("h200", ("h200",))):
        if any(m in kind for m in marks):
            return name
    return None


@dataclasses.dataclass(frozen=True)
class DecodeWork:
    """One decode step of a sampler call, what 'auto' prices (`decode_costs`): the text model's widths in the compute
    dtype, the call's decode rows and the KV slots each row reads (a group's prompt slots read once per group)."""
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    mlp: int
    vocab: int
    itemsize: int
    rows: int           # decode rows of the call (prompts x G)
    own_slots: int      # KV slots each row reads alone
    prefix_slots: int   # KV slots a group of `group` rows reads once (cascade); 0 without
    group: int          # rows sharing a prefix (1 without)

    @classmethod
    def of(cls, text, itemsize: int, rows: int, prompt_slots: int, max_new: int, group: int, cascade: bool):
        """Returns the work of a call of `rows` rows (group `group`) over a prompt bucket of `prompt_slots` and
        `max_new` new tokens, on a TextConfig `text` (sampling/sampler.py `_generate`'s caches)."""
        shared = cascade and group > 1
        return cls(text.num_hidden_layers, text.hidden_size, text.num_attention_heads, text.num_key_value_heads,
                   text.head_dim, text.intermediate_size, text.vocab_size, int(itemsize), int(rows),
                   int(max_new if shared else prompt_slots + max_new), int(prompt_slots if shared else 0),
                   int(group if shared else 1))

    def weight_bytes(self, tensor: int) -> int:
        """Returns one device's bytes of the decode copy's matrices with `tensor` shards (1: whole); a width the
        shards do not divide stays whole, as logical_to_spec leaves it."""
        def part(n, width):
            return n // tensor if width % tensor == 0 else n
        d, hd = self.hidden, self.head_dim
        layer = (part(d * self.heads * hd * 2, self.heads) + part(d * self.kv_heads * hd * 2, self.kv_heads)
                 + part(3 * d * self.mlp, self.mlp))
        return (self.layers * layer + part(d * self.vocab, self.vocab)) * self.itemsize

    def kv_bytes(self, rows: int, kv_shards: int) -> int:
        """Returns the KV cache bytes a device holding `rows` rows (KV heads in `kv_shards`) reads a step."""
        slot = 2 * self.layers * (self.kv_heads // kv_shards) * self.head_dim * self.itemsize
        groups = -(-rows // self.group) if self.prefix_slots else 0
        return slot * (rows * self.own_slots + groups * self.prefix_slots)


@dataclasses.dataclass(frozen=True)
class DecodeCost:
    """One device's share of a decode step in a layout."""
    layout: str
    rows: int              # rows a device decodes (the call's rows padded to the row shards)
    weight_bytes: int
    kv_bytes: int
    collective_bytes: int  # activations (and logits) a device sends in the step's collectives
    collectives: int
    seconds: float

    @property
    def read_bytes(self) -> int:
        return self.weight_bytes + self.kv_bytes

    def __str__(self) -> str:
        return (f"{self.layout}: {self.rows} row(s) a device, reads {self.weight_bytes / 1e9:.3f} GB weights + "
                f"{self.kv_bytes / 1e9:.3f} GB KV, {self.collectives} collectives of {self.collective_bytes / 1e6:.3f}"
                f" MB, {self.seconds * 1e3:.3f} ms a step")


def decode_costs(mesh: Mesh, work: DecodeWork, bandwidth: Bandwidth = DEFAULT_BANDWIDTH) -> dict[str, DecodeCost]:
    """Returns the 'tensor' and 'replicated' layouts' costs of one decode step on `mesh`.

    A step's time on a device: the bytes it reads (its weights, its rows' KV cache) over the memory bandwidth, plus
    its collectives as rings over the tensor axis (an all-reduce of n bytes: 2(t-1) hops of latency and 2(t-1)/t n
    bytes over the link). Devices run in parallel, so a device's time is the step's. 'tensor' all-reduces the
    activations twice a layer and once after the embedding lookup, and all-gathers the fp32 logits; 'replicated'
    sends nothing. Compute is left out: a decode step's few rows leave the chip waiting on memory."""
    t = mesh.shape.get("tensor", 1)
    costs = {}
    for layout, shards, tensor in (("tensor", mesh.size // t, t), ("replicated", mesh.size, 1)):
        rows = -(-work.rows // shards)
        weights = work.weight_bytes(tensor)
        kv = work.kv_bytes(rows, tensor if work.kv_heads % tensor == 0 else 1)
        reduce_bytes = rows * work.hidden * work.itemsize
        gather_bytes = rows * work.vocab * 4 if work.vocab % tensor == 0 else 0
        n_reduce, n_gather = (2 * work.layers + 1, int(gather_bytes > 0)) if tensor > 1 else (0, 0)
        ring = (tensor - 1) / tensor
        sent = n_reduce * 2 * ring * reduce_bytes + n_gather * ring * gather_bytes
        hops = (n_reduce * 2 + n_gather) * (tensor - 1)
        seconds = (weights + kv) / bandwidth.memory_bytes_per_s + sent / bandwidth.link_bytes_per_s
        seconds += hops * bandwidth.hop_s
        costs[layout] = DecodeCost(layout, rows, weights, kv, int(sent), n_reduce + n_gather, seconds)
    return costs


def pick_decode_sharding(layout: str, mesh: Mesh | None, copy_bytes: int, device_bytes: int | None, *,
                         work: DecodeWork | None = None, chip: str | None = None) -> str:
    """Returns the decode layout `layout` resolves to. 'auto': 'training' without a multi-device mesh; else the
    cheaper of 'tensor' and 'replicated' by `decode_costs` with `chip`'s BANDWIDTHS (None: DEFAULT_BANDWIDTH), the
    replicated copy only when it fits AUTO_REPLICATED_SHARE of `device_bytes` (unknown: always); 'training' (no
    copy) where the mesh has no FSDP axis and 'tensor' is the choice, as the weights already lie so. Without `work`
    the layouts are priced by their weights alone (`copy_bytes` whole against split over the tensor axis)."""
    if layout not in DECODE_SHARDINGS:
        raise ValueError(f"decode sharding {layout!r}: expected one of {DECODE_SHARDINGS}")
    if layout != "auto":
        return layout
    if mesh is None or mesh.size == 1:
        return "training"
    fits = not device_bytes or copy_bytes <= AUTO_REPLICATED_SHARE * device_bytes
    if mesh.shape.get("fsdp", 1) == 1 and not (fits and mesh.shape.get("tensor", 1) == 1):
        return "training"  # without FSDP the weights already lie as 'tensor' lays them: a copy would only double them
    if work is None:
        return "replicated" if fits and mesh.shape.get("tensor", 1) == 1 else "tensor"
    costs = decode_costs(mesh, work, BANDWIDTHS.get(chip, DEFAULT_BANDWIDTH))
    return "replicated" if fits and costs["replicated"].seconds <= costs["tensor"].seconds else "tensor"
