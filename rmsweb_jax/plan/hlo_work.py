"""The work of one run of a compiled program per device, every loop body counted as often as its loop runs.

`weighted_work` walks an HLO module (plan/hlo.py) from ENTRY and counts dot and convolution FLOPs, Mosaic kernels'
FLOPs by their own formulas (KERNEL_FLOPS) and the bytes each collective delivers, with every while body times its
trip count, which `cost_analysis()` does not (it counts a loop body once and a Mosaic kernel not at all).
"""
from __future__ import annotations

import dataclasses
import functools
import math
import re
import types
from typing import Mapping

from rmsweb_jax.plan.hlo import (HloModuleText, Instruction, arrays, called_computations, delivered_bytes,
                                 read_module, tuple_elements)

COLLECTIVES = ("all-gather", "all-reduce", "reduce-scatter", "all-to-all", "collective-permute",
               "collective-broadcast", "ragged-all-to-all")


@dataclasses.dataclass(frozen=True)
class Work:
    """One run of a compiled program per device, each loop body counted as many times as its loop runs."""
    flops: float                           # dot and convolution FLOPs XLA runs (2 per multiply-add)
    kernel_flops: float                    # Mosaic kernels' matmul FLOPs (kernel_flops() says how each is counted)
    collective_bytes: Mapping[str, float]  # {collective opcode: bytes its results deliver to this device}
    kernel_calls: Mapping[str, float]      # {Mosaic kernel name: calls}
    unknown_kernels: tuple[str, ...]       # kernels called with no FLOP formula: their work is not in kernel_flops
    unknown_trip_counts: tuple[str, ...]   # while loops whose trip count could not be read: counted once
    bounded_trip_counts: tuple[str, ...]   # loops with a data-dependent exit (the decode loop): counted at their bound

    @property
    def total_flops(self) -> float:
        """Returns XLA's dot/convolution FLOPs plus the Mosaic kernels' FLOPs."""
        return self.flops + self.kernel_flops

    @property
    def total_collective_bytes(self) -> float:
        return sum(self.collective_bytes.values())


class _Tally:
    """A mutable sum of Work's fields while walking."""

    def __init__(self):
        self.flops = self.kernel_flops = 0.0
        self.collective_bytes: dict[str, float] = {}
        self.kernel_calls: dict[str, float] = {}
        self.unknown_kernels: set[str] = set()
        self.unknown_trip_counts: set[str] = set()
        self.bounded_trip_counts: set[str] = set()
        # Collectives inside fused computations, not yet counted, by what identifies one: an async collective
        # fusion prints its collective in each of its start, overlapped and done fusions (one channel, one shape).
        self.channels: dict[tuple, tuple[str, float]] = {}

    def close_channels(self) -> None:
        for kind, size in self.channels.values():
            self.collective_bytes[kind] = self.collective_bytes.get(kind, 0.0) + size
        self.channels = {}

    def add(self, other: "_Tally", times: float) -> None:
        self.flops += times * other.flops
        self.kernel_flops += times * other.kernel_flops
        for mine, theirs in ((self.collective_bytes, other.collective_bytes), (self.kernel_calls, other.kernel_calls)):
            for key, value in theirs.items():
                mine[key] = mine.get(key, 0.0) + times * value
        self.unknown_kernels |= other.unknown_kernels
        self.unknown_trip_counts |= other.unknown_trip_counts
        self.bounded_trip_counts |= other.bounded_trip_counts
        self.channels.update(other.channels)


def _dims(shape: str) -> tuple[int, ...]:
    found = arrays(shape)
    return found[0][1] if found else ()


def _int_list(attributes: str, key: str) -> list[int]:
    m = re.search(rf"\b{key}=\{{([\d,]*)\}}", attributes)
    return [int(x) for x in m.group(1).split(",") if x] if m else []


def dot_flops(inst: Instruction, shapes: dict[str, str]) -> float:
    """Returns 2 x (output elements) x (product of the lhs contracting dims) of a `dot`."""
    lhs = _dims(shapes[inst.operands[0]])
    contracting = math.prod(lhs[d] for d in _int_list(inst.attributes, "lhs_contracting_dims"))
    return 2.0 * math.prod(_dims(inst.shape)) * contracting


def _valid_taps(size: int, out: int, stride: int, low: int, lhs_dilation: int, rhs_dilation: int, window: int) -> int:
    """Returns the (output position, window tap) pairs of one spatial dim that land on the input, not its padding."""
    span = (size - 1) * lhs_dilation + 1
    total = 0
    for k in range(window):
        offset = k * rhs_dilation - low  # input position of output o: o * stride + offset
        if lhs_dilation == 1:
            first = max(0, -(offset // stride))
            last = min(out - 1, (span - 1 - offset) // stride)
            total += max(0, last - first + 1)
        else:
            total += sum(1 for o in range(out) if 0 <= o * stride + offset < span
                         and (o * stride + offset) % lhs_dilation == 0)
    return total


def convolution_flops(inst: Instruction, shapes: dict[str, str]) -> float:
    """Returns 2 x the multiply-adds of a `convolution` (XLA:TPU writes most matmuls as one): per output element,
    the kernel's input features times the window taps that fall on the input rather than on its padding."""
    labels = re.search(r"dim_labels=(\w+)_(\w+)->(\w+)", inst.attributes)
    if labels is None:
        raise ValueError(f"convolution %{inst.name} has no dim_labels: {inst.text[:160]!r}")
    lhs_l, rhs_l, out_l = labels.groups()
    lhs, rhs, out = _dims(shapes[inst.operands[0]]), _dims(shapes[inst.operands[1]]), _dims(inst.shape)
    window = re.search(r"window=\{([^}]*)\}", inst.attributes)
    fields = dict(f.split("=", 1) for f in window.group(1).split()) if window else {}

    def per_dim(key: str, default: str) -> list[str]:
        return fields[key].split("x") if key in fields else [default] * len(spatial)

    spatial = [c for c in rhs_l if c.isdigit()]
    sizes, strides = per_dim("size", "1"), per_dim("stride", "1")
    pads, lhs_dil, rhs_dil = per_dim("pad", "0_0"), per_dim("lhs_dilate", "1"), per_dim("rhs_dilate", "1")
    taps = 1
    for n, c in enumerate(spatial):
        taps *= _valid_taps(lhs[lhs_l.index(c)], out[out_l.index(c)], int(strides[n]), int(pads[n].split("_")[0]),
                            int(lhs_dil[n]), int(rhs_dil[n]), int(sizes[n]))
    non_spatial_out = math.prod(out[i] for i, c in enumerate(out_l) if not c.isdigit())
    return 2.0 * non_spatial_out * rhs[rhs_l.index("i")] * taps


# Mosaic kernels the project emits, by name, and the matmul FLOPs of one call from its operands.
# Splash attention: q [..., T, d] (the heads and any vmapped batch leading), k/v [..., S, d]. One matmul over the
# (query, key) blocks the kernel's grid visits is 2 x |q| x S' FLOPs, S' the keys its grid spans per query block:
# S when the grid is dense, fewer when the mask's block table (the first s8/s32 operand, [heads, q blocks, grid] and
# [heads, grid, kv blocks] for dkv) is shrunk to a band (the vision window). The forward runs 2 matmuls (QK^T, PV),
# the dq kernel 3 (QK^T again, dO V^T, dS K), the dkv kernel 4 (QK^T, dO V^T, P^T dO, dS^T Q) and 5 when it also
# gives dq (the fused backward). Blocks of the grid that the mask empties are skipped by the kernel and still
# counted here: a causal mask runs about half of them.
# Token log-probs (kernels/token_logprobs_tpu.py): h [T, D], W [D, V]; the forward 1 matmul (2TDV), dh and dW 2
# each (the logit tile again, then dz W^T or h^T dz). Grouped advantages: elementwise, 0 matmul FLOPs.
_FLOATS = ("bf16", "f16", "f32")


def _metadata_int(inst: Instruction, key: str) -> int | None:
    m = re.search(rf'{key}\\?"\s*:\s*(\d+)', inst.text)  # inside the escaped JSON of xprof_metadata
    return int(m.group(1)) if m else None


def _splash_flops(inst: Instruction, operands: list[tuple[str, tuple[int, ...]]]) -> float | None:
    floats = [dims for dtype, dims in operands if dtype in _FLOATS and len(dims) >= 2][:3]
    tables = [dims for dtype, dims in operands if dtype not in _FLOATS and len(dims) == 3]
    if len(floats) < 3:
        return None
    q, k = floats[0], floats[1]
    seq_minor = _metadata_int(inst, "q_layout") == 2, _metadata_int(inst, "k_layout") == 2  # QKVLayout.SEQ_MINOR
    t, s = (q[-1] if seq_minor[0] else q[-2]), (k[-1] if seq_minor[1] else k[-2])
    phase = re.search(r"splash_m[hq]a_(fwd|dq|dkv)", inst.name).group(1)
    matmuls = {"fwd": 2, "dq": 3, "dkv": 5 if len(tuple_elements(inst.shape)) >= 6 else 4}[phase]
    span = 1.0
    if tables and phase == "dkv":  # grid (heads, kv blocks, query blocks visited)
        span = min(1.0, tables[0][-2] * (_metadata_int(inst, "block_q_dkv") or t // tables[0][-1]) / t)
    elif tables:  # grid (heads, query blocks, key blocks visited)
        block_kv = _metadata_int(inst, "block_kv_dq" if phase == "dq" else "block_kv") or t // tables[0][-2]
        span = min(1.0, tables[0][-1] * block_kv / s)
    return matmuls * 2.0 * math.prod(q) * s * span


def _token_logprobs_flops(inst: Instruction, operands: list[tuple[str, tuple[int, ...]]]) -> float | None:
    floats = [dims for dtype, dims in operands if dtype in _FLOATS and len(dims) == 2][:2]
    if len(floats) < 2:
        return None
    (t, d), (_, v) = floats
    return (1 if inst.name.startswith("token_logprobs_fwd") else 2) * 2.0 * t * d * v


KERNEL_FLOPS = ((re.compile(r"splash_m[hq]a_(fwd|dq|dkv)"), _splash_flops),
                (re.compile(r"token_logprobs_(fwd|dh|dw)"), _token_logprobs_flops),
                (re.compile(r"grouped_advantages"), lambda inst, operands: 0.0))


def kernel_name(inst: Instruction) -> str:
    """Returns a Mosaic custom-call's kernel name: the `name=` its pallas_call was given (the instruction's name
    without XLA's numeric and clone suffixes, or the scope before 'pallas_call' in its op_name)."""
    name = inst.name.split(".")[0]
    scoped = re.search(r'op_name="[^"]*?([\w\-]+)/pallas_call"', inst.attributes)
    return scoped.group(1) if name.startswith("custom-call") and scoped else name


def kernel_flops(inst: Instruction, shapes: dict[str, str]) -> float | None:
    """Returns the matmul FLOPs of a Mosaic kernel call by KERNEL_FLOPS, or None for a kernel it has no formula for."""
    name = kernel_name(inst)
    operands = [found[0] for found in (arrays(shapes.get(o, "")) for o in inst.operands) if found]
    for pattern, formula in KERNEL_FLOPS:
        if pattern.match(name):
            return formula(inst, operands)
    return None


# ---- trip counts -------------------------------------------------------------------------------------------------
# XLA:TPU's scheduled HLO drops `known_trip_count`; the loop's condition says it: a counter (a tuple element) compared
# with a constant, started from a constant in the caller and stepped by a constant in the body.
def _expr(comps, comp: dict[str, Instruction], name: str, args=None):
    """Returns a small symbolic value of an instruction: ('c', n), ('iv', tuple index, offset), ('p', k),
    ('cmp', direction, a, b), ('and', [parts]) or None."""
    inst = comp.get(name)
    if inst is None:
        return None
    op = inst.opcode
    if op == "constant":
        m = re.match(r"\s*constant\((-?\d+)\)", inst.text[inst.text.index(inst.shape) + len(inst.shape):])
        return ("c", int(m.group(1))) if m else None
    if op in ("copy", "bitcast", "convert", "reshape") and inst.operands:
        return _expr(comps, comp, inst.operands[0], args)
    if op == "parameter":
        k = int(re.search(r"parameter\((\d+)\)", inst.text).group(1))
        return args[k]() if args is not None else ("p", k)
    if op == "get-tuple-element":
        base = _expr(comps, comp, inst.operands[0], args)
        index = int(re.search(r"\bindex=(\d+)", inst.attributes).group(1))
        return ("iv", index, 0) if base == ("p", 0) else None
    if op in ("add", "subtract", "compare", "and", "fusion"):
        parts = [functools.partial(_expr, comps, comp, o, args) for o in inst.operands]
        if op == "fusion":
            called = comps.get(called_computations(inst)[0], ())
            inner = {i.name: i for i in called}
            root = next((i for i in called if i.root), None)
            return _expr(comps, inner, root.name, parts) if root else None
        values = [p() for p in parts]
        if op == "and":
            return ("and", values)
        if op == "compare":
            direction = re.search(r"direction=(\w+)", inst.attributes).group(1)
            return ("cmp", direction, values[0], values[1])
        a, b = values
        sign = 1 if op == "add" else -1
        if a and b and a[0] == "c" and b[0] == "c":
            return ("c", a[1] + sign * b[1])
        if a and b and a[0] == "iv" and b[0] == "c":
            return ("iv", a[1], a[2] + sign * b[1])
        if a and b and a[0] == "c" and b[0] == "iv" and op == "add":
            return ("iv", b[1], b[2] + a[1])
    return None


def _trips_of(cmp, init: dict[int, int | None], step: dict[int, int | None]) -> int | None:
    """Returns how many times `iv + offset <direction> bound` holds from the counter's start by its step."""
    _, direction, a, b = cmp
    if b and b[0] == "iv" and a and a[0] == "c":
        a, b = b, a
        direction = {"LT": "GT", "LE": "GE", "GT": "LT", "GE": "LE"}.get(direction, direction)
    if not (a and a[0] == "iv" and b and b[0] == "c"):
        return None
    start, by = init.get(a[1]), step.get(a[1])
    if start is None or not by:
        return None
    gap = b[1] - (start + a[2])  # the loop runs while the counter's distance to the bound has the right sign
    if direction in ("LT", "LE") and by > 0:
        return max(0, -(-(gap + (direction == "LE")) // by))
    if direction in ("GT", "GE") and by < 0:
        return max(0, -(-(-gap + (direction == "GE")) // -by))
    if direction == "NE" and gap % by == 0 and gap // by >= 0:
        return gap // by
    return None


def trip_count(inst: Instruction, caller: dict[str, Instruction], comps) -> tuple[int | None, bool]:
    """Returns (trip count, exact) of a `while`: XLA's known_trip_count when written, else read from its condition;
    exact is False when the condition also has a data-dependent exit (the count is then a bound); (None, False) when
    the count cannot be read."""
    known = re.search(r'"known_trip_count":\{"n":"(\d+)"\}', inst.attributes)
    if known:
        return int(known.group(1)), True
    cond_name = re.search(r"condition=%([\w.\-]+)", inst.attributes).group(1)
    body_name = re.search(r"body=%([\w.\-]+)", inst.attributes).group(1)
    cond = {i.name: i for i in comps[cond_name]}
    root = next((i for i in comps[cond_name] if i.root), None)
    body_root = next((i for i in comps[body_name] if i.root), None)
    if root is None or body_root is None:
        return None, False
    value = _expr(comps, cond, root.name)
    exact, compares = True, []
    if value and value[0] == "and":
        exact, compares = False, [v for v in value[1] if v and v[0] == "cmp"]
    elif value and value[0] == "cmp":
        compares = [value]
    start = caller.get(inst.operands[0]) if inst.operands else None
    body = {i.name: i for i in comps[body_name]}
    init, step = {}, {}
    for cmp in compares:
        for side in cmp[2:]:
            if side and side[0] == "iv":
                k = side[1]
                if start is not None and start.opcode == "tuple" and k < len(start.operands):
                    v = _expr(comps, caller, start.operands[k])
                    init[k] = v[1] if v and v[0] == "c" else None
                if body_root.opcode == "tuple" and k < len(body_root.operands):
                    v = _expr(comps, body, body_root.operands[k])
                    step[k] = v[2] if v and v[0] == "iv" and v[1] == k else None
    counts = [n for n in (_trips_of(c, init, step) for c in compares) if n is not None]
    return (min(counts), exact and len(counts) == len(compares)) if counts else (None, False)


def _comp_work(module: HloModuleText, name: str, memo: dict[str, _Tally], fused: bool = False) -> _Tally:
    """Returns the work of one run of computation `name`; a `fused` one (called by a fusion or an async start)
    leaves its channel-numbered collectives to its caller, which counts each (channel, shape) once."""
    if name in memo:
        return memo[name]
    comps = module.computations
    insts = comps[name]
    shapes = {i.name: i.shape for i in insts}
    by_name = {i.name: i for i in insts}
    tally = _Tally()
    memo[name] = tally  # a computation never calls itself; this stops a malformed module from recursing forever
    for inst in insts:
        op = inst.opcode
        if op == "dot":
            tally.flops += dot_flops(inst, shapes)
        elif op == "convolution":
            tally.flops += convolution_flops(inst, shapes)
        elif op == "custom-call" and 'custom_call_target="tpu_custom_call"' in inst.attributes:
            kernel = kernel_name(inst)
            tally.kernel_calls[kernel] = tally.kernel_calls.get(kernel, 0.0) + 1
            flops = kernel_flops(inst, shapes)
            if flops is None:
                tally.unknown_kernels.add(kernel)
            else:
                tally.kernel_flops += flops
        elif op in COLLECTIVES or (op.endswith("-done") and op[:-5] in COLLECTIVES):
            kind = op[:-5] if op.endswith("-done") else op
            channel = re.search(r"\bchannel_id=(\d+)", inst.attributes)
            if fused and channel:
                dims = re.search(r"\bdimensions=\{[\d,]*\}", inst.attributes)
                key = (channel.group(1), op, tuple(arrays(inst.shape)), dims.group() if dims else "")
                tally.channels[key] = (kind, delivered_bytes(inst))
            else:
                tally.collective_bytes[kind] = tally.collective_bytes.get(kind, 0.0) + delivered_bytes(inst)
        if op == "while":
            n, exact = trip_count(inst, by_name, comps)
            if n is None:
                tally.unknown_trip_counts.add(inst.name)
            elif not exact:
                tally.bounded_trip_counts.add(inst.name)
            runs = 1 if n is None else n
            cond = re.search(r"condition=%([\w.\-]+)", inst.attributes).group(1)
            body = re.search(r"body=%([\w.\-]+)", inst.attributes).group(1)
            tally.add(_comp_work(module, body, memo), runs)
            tally.add(_comp_work(module, cond, memo), runs + 1)
        elif op == "conditional":
            branches = [_comp_work(module, b, memo) for b in called_computations(inst)]
            if branches:  # one branch runs: count the costliest
                tally.add(max(branches, key=lambda t: t.flops + t.kernel_flops), 1)
        elif op == "call":
            tally.add(_comp_work(module, called_computations(inst)[0], memo), 1)
        elif op == "fusion" or (op.endswith("-start") and "calls=" in inst.attributes):
            for called in called_computations(inst):
                tally.add(_comp_work(module, called, memo, fused=True), 1)
    if not fused:
        tally.close_channels()
    return tally


@functools.lru_cache(maxsize=8)
def weighted_work(hlo: str) -> Work:
    """Returns the work of one run of a compiled program (its HLO text) per device, from ENTRY down: each while body
    counted as many times as its loop runs, fusions and calls through what they call, Mosaic kernels by
    KERNEL_FLOPS, and the bytes every collective delivers."""
    module = read_module(hlo)
    if module.entry is None:
        raise ValueError("HLO text has no ENTRY computation: pass a whole module (`compiled.as_text()`)")
    t = _comp_work(module, module.entry, {})
    # Read-only maps: one Work is shared by every caller of the cache.
    return Work(t.flops, t.kernel_flops, types.MappingProxyType(t.collective_bytes),
                types.MappingProxyType(t.kernel_calls),
                tuple(sorted(t.unknown_kernels)), tuple(sorted(t.unknown_trip_counts)),
                tuple(sorted(t.bounded_trip_counts)))
