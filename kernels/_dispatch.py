"""Which implementation a kernel call runs: Pallas on TPU, a pure-JAX path on CPU and GPU."""
from __future__ import annotations

from typing import NamedTuple

import jax

IMPLS = ("reference", "chunked", "pallas", "pallas_interpret")


class Launch(NamedTuple):
    """How to run a kernel: the implementation, and for Pallas the block layout and mode."""

    impl: str  # "reference" | "chunked" | "pallas"
    platform: str  # Pallas block layout: "tpu" (Mosaic) or "gpu" (Triton); "" otherwise
    interpret: bool


def default_platform() -> str:
    """Returns the Pallas layout for the default backend: "gpu" on GPUs, else "tpu".

    On CPU only interpret mode exists; the TPU layout is the one we keep honest there
    (its block shapes are what Mosaic would see).
    """
    return "gpu" if jax.default_backend() == "gpu" else "tpu"


def resolve(impl: str | None, *, allowed: tuple[str, ...], cpu_default: str) -> Launch:
    """Returns the Launch for `impl` (None: Pallas on TPU, `cpu_default` on CPU and GPU).

    GPU defaults to the pure-JAX path because it measured faster there: on an H200 the
    Triton-layout kernels took 5.5x (token log-probs) and 1.3x (grouped advantages) the time of
    XLA's versions (bench/README.md); impl="pallas" still selects them.
    """
    if impl is None:
        backend = jax.default_backend()
        if backend == "tpu":
            return Launch("pallas", backend, False)
        return Launch(cpu_default, "", False)
    if impl not in allowed:
        raise ValueError(f"impl must be None or one of {allowed}, got {impl!r}")
    if impl == "pallas":
        backend = jax.default_backend()
        if backend not in ("tpu", "gpu"):
            raise ValueError(
                f"impl='pallas' needs a TPU or GPU backend (have {backend!r}); "
                "use impl='pallas_interpret' on CPU")
        return Launch("pallas", backend, False)
    if impl == "pallas_interpret":
        return Launch("pallas", default_platform(), True)
    return Launch(impl, "", False)


def round_up(x: int, multiple: int) -> int:
    """Returns the smallest multiple of `multiple` that is >= x."""
    return -(-x // multiple) * multiple


def next_pow2(x: int) -> int:
    """Returns the smallest power of two >= x (Triton block sizes must be powers of two)."""
    return 1 << max(0, (int(x) - 1).bit_length())
