"""Model-level settings from the config: the mesh (`config.mesh.shape`), the sharding rules
(`config.sharding_rules`) and the runtime options (`config.model`)."""
from __future__ import annotations

import jax
import numpy as np

from rmsweb_jax.errors import UserError
from rmsweb_jax.models import qwen3_vl, sharding


def mesh_from_config(config, devices=None) -> jax.sharding.Mesh | None:
    """Returns the ('data','fsdp','tensor') mesh of `config.mesh.shape` (-1 = all remaining devices) over `devices`
    (default: every process's devices, the global mesh), or None for a one-device shape.

    A policy that samples on one host's own devices (`devices=jax.local_devices()`, multi-host eval and mine
    rollouts) lays the same shape over them: each host's browsers ask for steps at their own pace, so its
    sampling programs must not span other hosts."""
    shape = list(config.mesh.shape)
    if len(shape) != 3:
        raise UserError(f"config.mesh.shape must have 3 entries (data, fsdp, tensor), got {tuple(shape)}")
    devices = None if devices is None else list(devices)
    n = jax.device_count() if devices is None else len(devices)
    where = "" if devices is None else f" (over this host's {n} local devices)"
    if shape.count(-1) > 1:
        raise UserError(f"config.mesh.shape {tuple(shape)}: at most one -1")
    if -1 in shape:
        known = int(np.prod([s for s in shape if s != -1]))
        if n % known:
            raise UserError(f"config.mesh.shape {tuple(shape)}: {n} devices{where} are not divisible by {known}")
        shape[shape.index(-1)] = n // known
    elif devices is not None and int(np.prod(shape)) != n:
        raise UserError(f"config.mesh.shape {tuple(shape)} needs {int(np.prod(shape))} devices, but the model "
                        f"samples{where}; write -1 for one axis (e.g. (1, -1, 1)) so the shape fits both the global "
                        "mesh and one host's devices")
    if int(np.prod(shape)) == 1:
        return None
    return sharding.make_mesh(shape, devices=devices)


def rules_from_config(config):
    """Returns the logical-axis rules table of `config.sharding_rules` (configs/common.py: DEFAULT_RULES)."""
    return sharding.rules_from_config(config.sharding_rules)


def runtime_from_config(model_cfg) -> qwen3_vl.RuntimeOptions:
    """Returns RuntimeOptions from config.model (dtypes, remat, attention kernel, layer scan, decode layout);
    every field comes from the config (configs/common.py holds the defaults)."""
    return qwen3_vl.RuntimeOptions(param_dtype=model_cfg.param_dtype, compute_dtype=model_cfg.compute_dtype,
                                   remat_policy=model_cfg.remat_policy, attention_impl=model_cfg.attention_impl,
                                   scan_layers=model_cfg.scan_layers, decode_layout=model_cfg.decode_layout,
                                   decode_sharding=model_cfg.decode_sharding, group_decode=model_cfg.group_decode,
                                   decode_compaction=model_cfg.decode_compaction,
                                   vision_window=model_cfg.vision_window)
