"""Mesh and sharding rules from the config (`config.mesh.shape`, `config.sharding_rules`)."""
from __future__ import annotations

import jax
import numpy as np

from rmsweb_jax.models import sharding


def mesh_from_config(config) -> jax.sharding.Mesh | None:
    """Returns the ('data','fsdp','tensor') mesh of `config.mesh.shape` (-1 = all remaining devices), or None."""
    shape = list(config.mesh.shape)
    if len(shape) != 3:
        raise ValueError(f"config.mesh.shape must have 3 entries (data, fsdp, tensor), got {tuple(shape)}")
    n = jax.device_count()
    if shape.count(-1) > 1:
        raise ValueError(f"config.mesh.shape {tuple(shape)}: at most one -1")
    if -1 in shape:
        known = int(np.prod([s for s in shape if s != -1]))
        if n % known:
            raise ValueError(f"config.mesh.shape {tuple(shape)}: {n} devices are not divisible by {known}")
        shape[shape.index(-1)] = n // known
    if int(np.prod(shape)) == 1:
        return None
    return sharding.make_mesh(shape)


def rules_from_config(config):
    """Returns the logical-axis rules table of `config.sharding_rules` (defaults when absent)."""
    return sharding.rules_from_config(config.get("sharding_rules"))
