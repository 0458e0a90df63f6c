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

    A policy that samples on one host's own devices (`devices=jax.local_devices()` on several processes:
    multi-host eval and mine rollouts, whose browsers ask for steps at their own pace, so their sampling
    programs must not span other hosts) gets the shape `host_mesh_shape` fits to them."""
    shape = list(config.mesh.shape)
    if len(shape) != 3:
        raise UserError(f"config.mesh.shape must have 3 entries (data, fsdp, tensor), got {tuple(shape)}")
    devices = None if devices is None else list(devices)
    n = jax.device_count() if devices is None else len(devices)
    if devices is not None and jax.process_count() > 1 and set(devices) == set(jax.local_devices()):
        shape = list(host_mesh_shape(_resolved(shape, jax.device_count(), ""), n))
    where = "" if devices is None else f" (over the {n} devices given)"
    if -1 in shape:
        shape = _resolved(shape, n, where)
    elif devices is not None and int(np.prod(shape)) != n:
        raise UserError(f"config.mesh.shape {tuple(shape)} needs {int(np.prod(shape))} devices, but {n} are given; "
                        "write -1 for one axis (e.g. (1, -1, 1)) so the shape fits any device count")
    if int(np.prod(shape)) == 1:
        return None
    return sharding.make_mesh(shape, devices=devices)


def _resolved(shape, n: int, where: str) -> list[int]:
    """Returns `shape` with its -1 (at most one) set to what the other axes leave of `n` devices."""
    shape = list(shape)
    if shape.count(-1) > 1:
        raise UserError(f"config.mesh.shape {tuple(shape)}: at most one -1")
    if -1 in shape:
        known = int(np.prod([s for s in shape if s != -1]))
        if n % known:
            raise UserError(f"config.mesh.shape {tuple(shape)}: {n} devices{where} are not divisible by {known}")
        shape[shape.index(-1)] = n // known
    return shape


def host_mesh_shape(shape, devices: int) -> tuple[int, int, int]:
    """Returns the (data, fsdp, tensor) shape of a model one host samples alone on its `devices` devices: the
    config's tensor axis where it fits the host (else its largest divisor that divides `devices`: a pod's tensor
    group may span hosts), FSDP over the rest; no data axis (one model copy per host)."""
    tensor = int(shape[2])
    tensor = max(t for t in range(1, tensor + 1) if tensor % t == 0 and devices % t == 0)
    return 1, devices // tensor, tensor


def host_copy_config(config):
    """Returns a copy of `config` for a model one host samples alone (mesh_from_config on jax.local_devices()):
    its weights in the compute dtype, as sampling reads them (no fp32 master copy: nothing trains it)."""
    copy = config.copy_and_resolve_references()
    copy.model.param_dtype = copy.model.compute_dtype
    return copy


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
