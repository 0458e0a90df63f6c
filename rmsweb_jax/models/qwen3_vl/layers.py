"""Small building blocks shared by the vision tower and the text decoder: params, norms, remat."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


def param(rngs: nnx.Rngs | None, shape, axes, *, init: str = "normal", std: float = 0.02,
          dtype=jnp.float32) -> nnx.Param:
    """Returns an nnx.Param of `shape` with logical `axes` metadata (init: normal / zeros / ones)."""
    if len(axes) != len(shape):
        raise ValueError(f"param shape {shape} and logical axes {axes} differ in rank")
    if init == "normal":
        value = std * jax.random.normal(rngs.params(), shape, jnp.float32)
    elif init == "zeros":
        value = jnp.zeros(shape, jnp.float32)
    elif init == "ones":
        value = jnp.ones(shape, jnp.float32)
    else:
        raise ValueError(f"unknown init {init!r}")
    return nnx.Param(value.astype(dtype), axes=tuple(axes))


def rms_norm(x: jax.Array, scale: jax.Array, eps: float) -> jax.Array:
    """Returns RMSNorm(x) * scale computed in fp32, cast back to x's dtype (as transformers does)."""
    xf = x.astype(jnp.float32)
    xf = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps)
    return scale.astype(x.dtype) * xf.astype(x.dtype)


def layer_norm(x: jax.Array, scale: jax.Array, bias: jax.Array, eps: float = 1e-6) -> jax.Array:
    """Returns LayerNorm(x) computed in fp32 and cast back to x's dtype."""
    xf = x.astype(jnp.float32)
    mean = jnp.mean(xf, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(xf - mean), axis=-1, keepdims=True)
    y = (xf - mean) * jax.lax.rsqrt(var + eps)
    return (y * scale.astype(jnp.float32) + bias.astype(jnp.float32)).astype(x.dtype)


def rotate_half(x: jax.Array) -> jax.Array:
    """Returns concat(-x2, x1) of the two halves of the last axis (the RoPE companion)."""
    x1, x2 = jnp.split(x, 2, axis=-1)
    return jnp.concatenate([-x2, x1], axis=-1)


def remat(fn, policy: str):
    """Returns `fn` wrapped in jax.checkpoint according to the named remat policy."""
    if policy == "none":
        return fn
    policies = {
        "full": jax.checkpoint_policies.nothing_saveable,
        "dots": jax.checkpoint_policies.checkpoint_dots,
        "dots_with_no_batch_dims": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
        "save_attention_out": jax.checkpoint_policies.save_only_these_names("attention_out"),
    }
    if policy not in policies:
        raise ValueError(f"unknown remat policy {policy!r}; expected 'none' or one of {sorted(policies)}")
    return jax.checkpoint(fn, policy=policies[policy], prevent_cse=False)


def values(module: nnx.Module, names) -> dict[str, jax.Array]:
    """Returns {name: array} for the named nnx.Param attributes of `module` (the scan's xs)."""
    return {n: getattr(module, n)[...] for n in names}


def num_params(tree) -> int:
    """Returns the total element count of a pytree of arrays or ShapeDtypeStructs."""
    return int(sum(np.prod(x.shape) for x in jax.tree.leaves(tree)))
