"""Accelerator chips the planner knows (HBM bytes, dense bf16 FLOP/s) and slice topologies -> device counts."""
from __future__ import annotations

import dataclasses
import math
import re

from rmsweb_jax.errors import UserError


@dataclasses.dataclass(frozen=True)
class Chip:
    name: str
    hbm_bytes: int            # per chip (one JAX device: a v5p megacore chip is one device)
    peak_flops: float         # dense bf16 FLOP/s per chip, no sparsity
    cores_per_chip: int       # what a "<gen>-N" slice name counts: TensorCores (v5p: 2 per chip) or chips
    link_bytes_per_s: float   # chip-to-chip bandwidth per chip, all links and directions as quoted (ICI; NVLink)
    torus_dims: int           # dimensions of the ICI torus (its links split evenly over them); 0: a switch (NVLink)


# Vendor figures, read 2026-12 (decimal GB as the vendors print them, so the budget errs low):
#   v5e:  cloud.google.com/tpu/docs/v5e  "Peak compute per chip (bf16) 197 TFLOPs, HBM capacity per chip 16 GB"
#   v5p:  cloud.google.com/tpu/docs/v5p  "Peak compute per chip (bf16) 459 TFLOPs, HBM2e 95 GB"; slice names
#         count TensorCores, 2 per chip (v5p-8 = 2x2x1 = 4 chips)
#   v6e:  cloud.google.com/tpu/docs/v6e  "Peak compute per chip (bf16) 918 TFLOPs, HBM capacity 32 GB"
#   h100: NVIDIA H100 SXM datasheet: 989 TFLOPS dense BF16 (1,979 with sparsity), 80 GB HBM3
#   h200: NVIDIA H200 SXM datasheet: 989 TFLOPS dense BF16, 141 GB HBM3e
#   interconnect per chip: v5e 1,600 Gbps, v5p 4,800 Gbps, v6e 3,584 Gbps ICI (the same pages, "Interchip
#   Interconnect BW"); v5p's chips are wired in a 3-D torus (6 links), v5e's and v6e's in a 2-D torus (4 links)
#   (cloud.google.com/tpu/docs/system-architecture-tpu-vm); H100/H200 NVLink 900 GB/s through a switch (datasheets)
# The same peaks as rmsweb_jax/train/metrics.py PEAK_TFLOPS (what the trainer's MFU divides by).
HOST_CHIPS = 4  # chips one TPU VM host (one Python process) drives in a v5p / v6e / v5e pod slice

CHIPS = {
    "v5e": Chip("v5e", 16 * 10 ** 9, 197e12, 1, 1600e9 / 8, 2),
    "v5p": Chip("v5p", 95 * 10 ** 9, 459e12, 2, 4800e9 / 8, 3),
    "v6e": Chip("v6e", 32 * 10 ** 9, 918e12, 1, 3584e9 / 8, 2),
    "h100": Chip("h100", 80 * 10 ** 9, 989e12, 1, 900e9, 0),
    "h200": Chip("h200", 141 * 10 ** 9, 989e12, 1, 900e9, 0),
}
_SLICE_PREFIXES = {"v5e": ("v5e", "v5litepod"), "v5p": ("v5p",), "v6e": ("v6e",), "h100": ("h100",),
                   "h200": ("h200",)}


def chip(name: str) -> Chip:
    """Returns the chip called `name`, or raises UserError listing the known ones."""
    if name not in CHIPS:
        raise UserError(f"--chip={name!r}: unknown chip; expected one of {sorted(CHIPS)}")
    return CHIPS[name]


def device_count(c: Chip, topology: str) -> int:
    """Returns the JAX devices (chips) of `topology`: a slice name ('v5p-64' = 32 chips, 'v6e-16',
    'v5litepod-8'), a chip grid ('4x4x4', '2x4') or a plain chip count ('8')."""
    text = str(topology).strip().lower()
    named = re.fullmatch(r"([a-z0-9]+)-(\d+)", text)
    if named:
        prefix, cores = named.group(1), int(named.group(2))
        if prefix not in _SLICE_PREFIXES[c.name]:
            raise UserError(f"--topology={topology!r} names a {prefix} slice but --chip={c.name!r}; expected "
                            f"'{_SLICE_PREFIXES[c.name][0]}-N', a grid like '4x4' or a chip count")
        if cores % c.cores_per_chip:
            raise UserError(f"--topology={topology!r}: {c.name} slice names count TensorCores, "
                            f"{c.cores_per_chip} per chip; {cores} is not a multiple")
        return cores // c.cores_per_chip
    if re.fullmatch(r"\d+(x\d+)*", text):
        n = math.prod(int(x) for x in text.split("x"))
        if n >= 1:
            return n
    raise UserError(f"--topology={topology!r}: expected a slice name like '{_SLICE_PREFIXES[c.name][0]}-16', "
                    "a chip grid like '4x4x4', or a chip count like '8'")


def axis_bytes_per_s(c: Chip, devices: int, axis_size: int) -> float:
    """Returns the bandwidth one device's collective over a mesh axis of `axis_size` devices gets: a ring in each
    direction over every torus dimension the axis spans (a slice of `devices` chips taken as a cube), each
    dimension with its share of the chip's links; through a switch, the chip's whole bandwidth."""
    if c.torus_dims == 0 or axis_size <= 1:
        return c.link_bytes_per_s
    side = max(round(devices ** (1 / c.torus_dims)), 2)
    spanned = min(c.torus_dims, max(1, math.ceil(math.log(axis_size) / math.log(side) - 1e-9)))
    return c.link_bytes_per_s / c.torus_dims * spanned
