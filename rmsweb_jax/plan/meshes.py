"""The mesh a config should use on a slice: every candidate layout planned, the best MFU ceiling that fits proposed.

    python -m rmsweb_jax.plan --config=configs/qwen3_vl_8b_sft.py:v6e      # prints the candidates and the proposal
"""
from __future__ import annotations

import copy
import dataclasses

from rmsweb_jax.errors import UserError
from rmsweb_jax.plan import chips, memory, planner

# Meshes propose_mesh weighs, as MaxText's tables do for dense models: FSDP alone, or tensor 2 / 4 / 8 with FSDP over
# the rest (data parallelism would only add a gradient all-reduce on one slice).
MESH_CANDIDATES = ((1, -1, 1), (1, -1, 2), (1, -1, 4), (1, -1, 8))


@dataclasses.dataclass(frozen=True)
class MeshOption:
    """One candidate layout of a config on a slice: its plan, or why it cannot run."""
    mesh: tuple                 # config.mesh.shape
    microbatches: int           # config.train.microbatches: the config's, fewer when its rows do not divide
    plan: planner.Plan | None
    refused: str = ""           # why the layout cannot run ("" when it plans)

    @property
    def mfu_ceiling(self) -> float:
        """Returns the worst MFU ceiling of the plan's training stages (0 when it does not run or fit)."""
        if self.plan is None or not self.plan.fits():
            return 0.0
        return min((s.time.mfu_ceiling for s in self.plan.stages if s.time), default=0.0)


def propose_mesh(config, **plan_kwargs) -> list[MeshOption]:
    """Returns every MESH_CANDIDATES layout of `config` (keyword arguments as `plan` takes them), planned at the
    config's batch size with its microbatches, or fewer when a microbatch's rows would not divide over data x fsdp;
    `best_mesh` picks among them."""
    devices = chips.device_count(chips.chip(plan_kwargs["chip_name"]), plan_kwargs["topology"])
    batch, wanted = int(config.train.batch_size), int(config.train.microbatches)
    out = []
    for shape in MESH_CANDIDATES:
        axes = memory.mesh_shape(shape, devices) if devices % shape[2] == 0 else None
        dp = axes["data"] * axes["fsdp"] if axes else 0
        micro = next((m for m in range(wanted, 0, -1) if axes and batch % m == 0 and batch // m % dp == 0), 0)
        if not micro:
            out.append(MeshOption(shape, 0, None, f"{batch} rows do not divide into microbatches over "
                                                  f"data x fsdp = {dp or '?'}"))
            continue
        candidate = copy.deepcopy(config)
        candidate.mesh.shape, candidate.train.microbatches = shape, micro
        try:
            out.append(MeshOption(shape, micro, planner.plan(candidate, **plan_kwargs)))
        except UserError as err:
            out.append(MeshOption(shape, micro, None, str(err)))
    return out


def best_mesh(options: list[MeshOption]) -> MeshOption | None:
    """Returns the option with the best MFU ceiling among those that fit (None: none fits)."""
    fitting = [o for o in options if o.mfu_ceiling > 0]
    return max(fitting, key=lambda o: o.mfu_ceiling) if fitting else None


def mesh_table(options: list[MeshOption]) -> str:
    """Returns the candidates as a text table, the proposal marked."""
    best = best_mesh(options)
    lines = ["mesh candidates (data, fsdp, tensor):"]
    for o in options:
        mark = "->" if o is best else "  "
        if o.plan is None:
            lines.append(f"{mark} {str(o.mesh):12} refused: {o.refused}")
            continue
        w = o.plan.worst()
        times = [s.time for s in o.plan.stages if s.time]
        t = min(times, key=lambda x: x.mfu_ceiling) if times else None
        lines.append(f"{mark} {str(o.mesh):12} x{o.microbatches} microbatches: peak {w.total / planner.GiB:.1f} GiB "
                     f"({'fits' if o.plan.fits() else 'does NOT fit'})" + (
                         f", compute {t.compute_s:.2f} s, collectives {t.collective_s:.2f} s, step {t.step_s:.2f} s, "
                         f"MFU ceiling {t.mfu_ceiling:.0%}" if t else ""))
    lines.append(f"proposed: mesh {best.mesh} with {best.microbatches} microbatches" if best
                 else "proposed: none of the candidates fits")
    return "\n".join(lines) + "\n"
