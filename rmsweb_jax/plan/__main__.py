"""Command line of the planner: prints the plan's table, the train step's time and MFU ceiling, and the mesh it
proposes among the candidates (plan/meshes.py); exit status 2 (a UserError) when it does not fit.

    python -m rmsweb_jax.plan --config=configs/qwen3_vl_8b_sft.py:v5p
    python -m rmsweb_jax.plan --config=configs/demo.py --chip=v5e --topology=v5litepod-4

--chip and --topology default to the config's `plan` block (the slice a preset is sized for).
Nothing is allocated or compiled: the figures come from traced shapes (rmsweb_jax/plan/memory.py).
"""
from __future__ import annotations

import os
import sys

# Shapes only: never claim an accelerator. Set before the config file's imports bring in jax.
os.environ.setdefault("JAX_PLATFORMS", "cpu")

from absl import flags  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from rmsweb_jax.distributed import USABLE_HBM  # noqa: E402
from rmsweb_jax.errors import UserError, run_absl_command  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file("config", None, "ml_collections config file (path[:arg]).")
_CHIP = flags.DEFINE_string("chip", "", "v5e | v5p | v6e | h100 | h200 (default: config.plan.chip)")
_TOPOLOGY = flags.DEFINE_string("topology", "", "slice name (v5p-64), chip grid (4x4x4) or chip count "
                                "(default: config.plan.topology)")
_ARCH = flags.DEFINE_string("architecture", "", "8b | 32b | tiny | demo | path to config.json (default: "
                            "model.init's checkpoint or preset, else config.plan.architecture)")
_MFU = flags.DEFINE_float("mfu", 1.0, "share of the chip's peak FLOP/s the compute time is quoted at (1.0: the "
                          "roofline); the step time adds the collectives (plan/step_time.py) and the MFU ceiling "
                          "printed is model FLOPs / (devices x peak x that step time)")
_USABLE = flags.DEFINE_float("usable_hbm", USABLE_HBM, "share of HBM a plan may use (XLA's reserve, fragmentation; "
                             "on GPUs the share a run's JAX client takes, rmsweb_jax/distributed.py)")
_MESHES = flags.DEFINE_bool("propose_mesh", True, "also plan every candidate mesh (FSDP only, tensor 2/4/8) and "
                             "print the one with the best MFU ceiling that fits")
_COMPILE = flags.DEFINE_bool("compile", False, "also compile every program of the plan for the TPU slice ahead of "
                             "time (libtpu's compiler, no chip: plan/tpu_aot.py) and print the compiler's figures "
                             "beside the plan's; refuse a program whose compiled peak does not fit")
flags.mark_flags_as_required(["config"])


def _from_plan_block(config, key: str, given: str) -> str:
    if given:
        return given
    if "plan" in config and config.plan.get(key):
        return str(config.plan[key])
    raise UserError(f"--{key} is not given and the config has no plan.{key}; e.g. --chip=v5p --topology=v5p-64")


def main(argv) -> None:
    del argv
    from rmsweb_jax.plan.planner import architecture, plan
    config = _CONFIG.value
    try:
        model_config, arch_name = architecture(config, _ARCH.value)
        result = plan(config, chip_name=_from_plan_block(config, "chip", _CHIP.value),
                      topology=_from_plan_block(config, "topology", _TOPOLOGY.value), mfu=_MFU.value,
                      usable_fraction=_USABLE.value, config_name=config_flags.get_config_filename(flags.FLAGS["config"]),
                      arch=arch_name, model_config=model_config)
        print(result.table(), flush=True)
        if _MESHES.value and any(s.time for s in result.stages):
            from rmsweb_jax.plan import meshes
            options = meshes.propose_mesh(config, chip_name=result.chip.name, topology=str(result.devices),
                                          mfu=_MFU.value, usable_fraction=_USABLE.value, arch=arch_name,
                                          model_config=model_config)
            print(meshes.mesh_table(options), flush=True)
        if _COMPILE.value:
            from rmsweb_jax.plan import compiled
            print("compiling every program for the slice (about a minute each)...", flush=True)
            rows = compiled.compile_plan(result, config, model_config)
            print(compiled.table(rows, result), flush=True)
            compiled.check_fits(rows, result)
            figures = {name: figure for programs in compiled.STAGE_PROGRAMS.values() for name, figure in programs}
            result.check_compiled([(r.stage, figures[r.report.name], r.report.name, r.report.peak_bytes) for r in rows])
        result.check_fits()
    except UserError as err:
        print(f"error: {err}", file=sys.stderr, flush=True)
        sys.exit(2)


if __name__ == "__main__":
    run_absl_command(main, "plan")  # --help exits 0, fast: JAX is imported by main, after the flags are parsed
