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


def dense(x: jax.Array, kernel: jax.Array, n_in: int = 1) -> jax.Array:
    """Returns x contracted with the first `n_in` axes of `kernel` (x's last `n_in` axes), as one 2D GEMM.

    Flattening to [rows, in] x [in, out] keeps XLA:CPU on its fast GEMM path; dot_generals with several
    batch or contracting dims fall back to much slower loops there (measured 5-25x on the bench config).
    """
    lead, k_in, k_out = x.shape[:x.ndim - n_in], kernel.shape[:n_in], kernel.shape[n_in:]
    if x.shape[x.ndim - n_in:] != k_in:
        raise ValueError(f"dense: input {x.shape} does not end with kernel input dims {k_in}")
    y = x.reshape(-1, int(np.prod(k_in))) @ kernel.reshape(int(np.prod(k_in)), -1)
    return y.reshape(lead + k_out)


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


def run_layers(body, carry, xs, *, scan: bool = True):
    """Returns (carry, stacked ys) of body over the leading axis of xs: lax.scan, or a Python loop.

    The loop (scan=False) is MaxText's `scan_layers=False`: compile time grows with depth, but each
    layer's residuals are separate arrays instead of slices of stacked buffers that the scan zero-fills
    and writes every step. None leaves of xs stay None.
    """
    if scan:
        return jax.lax.scan(body, carry, xs)
    n = jax.tree.leaves(xs)[0].shape[0]
    ys = []
    for i in range(n):
        carry, y = body(carry, jax.tree.map(lambda a: a[i], xs))
        ys.append(y)
    if all(y is None for y in ys):
        return carry, None
    return carry, jax.tree.map(lambda *a: jnp.stack(a), *ys)
