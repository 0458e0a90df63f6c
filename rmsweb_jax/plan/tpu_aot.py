"""Ahead-of-time TPU compiles on any machine: libtpu's compiler over a slice's devices, no chip needed.

`topology_devices("v5p", 32)` gives the JAX devices of a real v5p slice (from
`jax.experimental.topologies`); a `Mesh` over them and `jax.ShapeDtypeStruct` inputs carrying their
`NamedSharding`s trace and compile the real TPU program (`compile_program`), whose memory analysis,
cost analysis and HLO are what the chip would run. Nothing is allocated. A CompileReport's `count` and
`work` read its HLO with plan/hlo.py and plan/hlo_work.py.

libtpu is found, in order: an importable `libtpu` module (a TPU VM's `pip install .[tpu]`), the folder
named by $RMSWEB_LIBTPU, or `<repo>/.venv/libtpu` (where `make install` puts it with `pip --target`). It is
kept off the venv's normal path on purpose: with libtpu importable, a plain `jax.devices()` on a machine
without a TPU spends ~20 s probing for one (FACTS.md); JAX_PLATFORMS=cpu avoids that probe and the
topology still loads.
"""
from __future__ import annotations

import dataclasses
import functools
import importlib.util
import os
import pathlib
import sys
import time
from typing import Any, Callable, Sequence

import jax

from rmsweb_jax.errors import UserError
from rmsweb_jax.plan.hlo import instructions, result_bytes
from rmsweb_jax.plan.hlo_work import Work, weighted_work

LIBTPU_ENV = "RMSWEB_LIBTPU"
_REPO_LIBTPU = pathlib.Path(__file__).resolve().parents[2] / ".venv" / "libtpu"

# Chip grids of the slices we compile for, by chip count (v5p: 3-D tori; v5e/v6e: 2-D). The names are
# what `topologies.get_topology_desc(topology_name=...)` takes: "<gen>:<grid>".
_GRIDS = {
    "v5p": {4: "2x2x1", 8: "2x2x2", 16: "2x2x4", 32: "2x4x4", 64: "4x4x4",
            128: "4x4x8", 256: "4x8x8", 512: "8x8x8"},
    "v6e": {1: "1x1", 4: "2x2", 8: "2x4", 16: "4x4", 32: "4x8", 64: "8x8", 128: "8x16", 256: "16x16"},
    "v5e": {1: "1x1", 4: "2x2", 8: "2x4", 16: "4x4", 32: "4x8", 64: "8x8", 128: "8x16", 256: "16x16"},
}
TPU_CHIPS = tuple(_GRIDS)
_DEVICE_KIND = {"v5p": "v5p", "v6e": "v6e", "v5e": "v5litepod"}  # topology name prefixes libtpu knows


class LibtpuUnavailable(RuntimeError):
    """libtpu cannot be found or loaded here: the reason is the message."""


def libtpu_dir() -> pathlib.Path | None:
    """Returns the folder to put on sys.path for libtpu, or None when `import libtpu` already works."""
    if importlib.util.find_spec("libtpu") is not None:
        return None
    given = os.environ.get(LIBTPU_ENV)
    folder = pathlib.Path(given).expanduser() if given else _REPO_LIBTPU
    if not (folder / "libtpu").is_dir():
        where = f"${LIBTPU_ENV}={given}" if given else f"{_REPO_LIBTPU} (make install puts it there)"
        raise LibtpuUnavailable(f"libtpu is not importable and not at {where}; install it with "
                                f"`pip install --no-deps --target DIR libtpu==<the version for jax {jax.__version__}>` "
                                f"and set {LIBTPU_ENV}=DIR")
    return folder


def libtpu_version() -> str:
    """Returns the installed libtpu's version ('unknown' when its metadata cannot be read)."""
    from importlib import metadata
    folder = libtpu_dir()
    paths = [str(folder)] if folder is not None else None
    for dist in metadata.distributions(path=paths) if paths else metadata.distributions():
        if dist.metadata["Name"] == "libtpu":
            return dist.version
    return "unknown"


def topology_name(chip: str, chips: int) -> str:
    """Returns libtpu's topology name ("v5p:4x4x2") of a `chip` slice of `chips` chips."""
    grids = _GRIDS.get(chip)
    if grids is None:
        raise UserError(f"--chip={chip!r}: ahead-of-time compiles know {sorted(_GRIDS)} (GPUs: compile on the GPU)")
    if chips not in grids:
        raise UserError(f"a {chip} slice of {chips} chips: ahead-of-time compiles know {sorted(grids)} chips")
    return f"{_DEVICE_KIND[chip]}:{grids[chips]}"


@functools.lru_cache(maxsize=None)
def topology_devices(chip: str, chips: int) -> tuple:
    """Returns the devices of a `chip` slice of `chips` chips (libtpu's compiler, no chip needed); the same device
    objects on every call (one program's inputs must sit on the same devices)."""
    folder = libtpu_dir()
    # Several compiling processes at once (pytest-xdist workers, a plan beside a test run): libtpu otherwise
    # takes /tmp/libtpu_lockfile as if it owned a chip, and the second process fails to load.
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")  # no GCE metadata server to ask: we are not on a TPU VM
    if folder is not None and str(folder) not in sys.path:
        sys.path.append(str(folder))
    from jax.experimental import topologies
    try:
        topo = topologies.get_topology_desc(topology_name=topology_name(chip, chips), platform="tpu")
    except Exception as err:  # noqa: BLE001 - libtpu raises plain RuntimeErrors/XlaRuntimeErrors here
        raise LibtpuUnavailable(f"libtpu could not describe {topology_name(chip, chips)}: {err}") from err
    return tuple(topo.devices)


@dataclasses.dataclass(frozen=True)
class CompileReport:
    """What the compiler says of one program, per device."""
    name: str
    seconds: float             # trace + lower + compile, wall clock
    argument_bytes: int
    output_bytes: int
    alias_bytes: int           # outputs that reuse (donated) argument buffers
    temp_bytes: int
    flops: float               # cost_analysis()['flops'] per device: a loop body once, no Mosaic kernel (see `work`)
    hlo: str
    # CPU time of this process over the compile (every thread): unlike `seconds`, not stretched by other work
    # sharing the cores, so it compares across runs and machines of one CPU model.
    cpu_seconds: float = 0.0

    @property
    def peak_bytes(self) -> int:
        """Returns arguments + outputs not aliased to them + temporaries: the program's live HBM at its peak."""
        return self.argument_bytes + self.output_bytes - self.alias_bytes + self.temp_bytes

    @property
    def work(self) -> Work:
        """Returns one run's work per device with every loop body counted as often as it runs (weighted_work)."""
        return weighted_work(self.hlo)

    def count(self, op: str, *, scope: str | None = None, min_bytes: int = 0) -> int:
        """Returns how many HLO instructions of opcode `op` (e.g. 'all-gather') of at least `min_bytes` per
        device the program holds; with `scope`, only those inside the while loop named so."""
        return sum(result_bytes(line) >= min_bytes for line in instructions(self.hlo, op, scope=scope))


def compile_program(name: str, fn: Callable, args: Sequence[Any], *, platform: str = "tpu",
                    compiler_options: dict | None = None) -> CompileReport:
    """Returns the CompileReport of `fn` (a jax.jit object) on abstract `args` (ShapeDtypeStructs with
    shardings over topology devices), compiled for `platform` with `compiler_options` (XLA/libtpu flags by name,
    e.g. `distributed.compiler_options(config.tpu.libtpu_init_args)`)."""
    start = time.perf_counter()
    cpu_start = time.process_time()
    # Traced at the chip's default matmul precision, as on a TPU VM: a process that set 'highest' for exact CPU
    # references (our tests) would otherwise hand Mosaic kernels bf16 dots with an fp32 contract precision, which
    # it refuses ("Bad lhs type"), in backward kernels traced outside any context the model code could set.
    # And at the compiler's full optimization, the program a TPU VM compiles: a process that set
    # jax_disable_most_optimizations (make test does, for its XLA:CPU programs) would otherwise report another one.
    deoptimized = jax.config.read("jax_disable_most_optimizations")
    jax.config.update("jax_disable_most_optimizations", False)
    try:
        with jax.default_matmul_precision("default"):
            compiled = fn.trace(*args).lower(lowering_platforms=(platform,)).compile(compiler_options=compiler_options)
    finally:
        jax.config.update("jax_disable_most_optimizations", deoptimized)
    seconds = time.perf_counter() - start
    cpu_seconds = time.process_time() - cpu_start
    mem = compiled.memory_analysis()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    return CompileReport(name, seconds, int(mem.argument_size_in_bytes), int(mem.output_size_in_bytes),
                         int(mem.alias_size_in_bytes), int(mem.temp_size_in_bytes), float(cost.get("flops", 0.0)),
                         compiled.as_text(), cpu_seconds)
