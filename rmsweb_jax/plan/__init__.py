"""The memory planner: `python -m rmsweb_jax.plan --config=configs/x.py [--chip=v5p] [--topology=v5p-64]`.

Per-device bytes of parameters, optimizer state, gradients, activations under the remat policy and
the sampler's KV cache, model FLOPs per step and the step time at a stated MFU, for each stage the
config runs, from abstract shapes alone; a config over the chip's HBM is refused with the figures.
"""
from rmsweb_jax.plan.chips import CHIPS, Chip
from rmsweb_jax.plan.planner import Plan, StagePlan, plan
