"""The memory planner: `python -m rmsweb_jax.plan --config=configs/x.py [--chip=v5p] [--topology=v5p-64]`.

Per-device bytes of parameters, optimizer state, gradients, activations under the remat policy and
the sampler's KV cache, and each training step's FLOPs, collectives, time and MFU ceiling as the compiled
program splits the work (step_time.py), for each stage the config runs, from abstract shapes alone; a config
over the chip's HBM is refused with the figures. `plan` also proposes the mesh with the best ceiling
(meshes.py); `--compile` compiles every program for the slice (tpu_aot.py, compiled.py; HLO read by hlo.py).
"""
import importlib

# Imported on first use (PEP 562), not here: `python -m rmsweb_jax.plan --help` imports this package first, and
# planner imports JAX (seconds) that help does not need.
_EXPORTS = {"CHIPS": "chips", "Chip": "chips", "Plan": "planner", "StagePlan": "planner", "plan": "planner"}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
