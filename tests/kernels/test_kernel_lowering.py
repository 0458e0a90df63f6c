"""Both kernels lower for TPU (Mosaic) and GPU (Triton) from this CPU-only machine.

jax.export runs the Pallas lowering for a named platform without the device: Mosaic's block
tiling rules ((8, 128) on the last two block dims) and Triton's power-of-two and dot-shape
rules are checked here. Compiling the lowered kernels needs the device (bench/gpu_kernels.py).
"""
import jax
import jax.numpy as jnp
import pytest

from kernels import grouped_advantage as ga
from kernels.token_logprobs_gpu import token_logprobs_gpu
from kernels.token_logprobs_tpu import token_logprobs_tpu

# Serializing a Triton kernel is refused by default (no compatibility guarantee); lowering is
# what we want to check.
DISABLED = [jax.export.DisabledSafetyCheck.custom_call("__gpu$xla.gpu.triton")]
PLATFORM = {"tpu": "tpu", "gpu": "cuda"}


def lower(fn, platform, *shapes):
    exported = jax.export.export(jax.jit(fn), platforms=[PLATFORM[platform]],
                                 disabled_checks=DISABLED)(*shapes)
    return exported.mlir_module()


@pytest.mark.parametrize("platform", ["tpu", "gpu"])
def test_grouped_advantages_lower(platform):
    fn = lambda r, m: ga.grouped_arrays_pallas(r, m, ga.Gates(), platform, False, None)  # noqa
    shape = jax.ShapeDtypeStruct((1000, 8), jnp.float32)
    module = lower(fn, platform, shape, shape)
    assert ("tpu_custom_call" if platform == "tpu" else "triton") in module


@pytest.mark.parametrize("platform", ["tpu", "gpu"])
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32], ids=["bf16", "f32"])
def test_token_logprobs_value_and_grad_lower(platform, dtype):
    kernel = token_logprobs_tpu if platform == "tpu" else token_logprobs_gpu

    def loss(h, w, y):
        logp, ent = kernel(h, w, y, temperature=0.9, return_entropy=True)
        return jnp.sum(logp) + 0.1 * jnp.sum(ent)

    # Ragged T; Qwen's vocabulary (151,936 = 1187 * 128).
    shapes = (jax.ShapeDtypeStruct((1000, 1024), dtype),
              jax.ShapeDtypeStruct((1024, 151_936), dtype),
              jax.ShapeDtypeStruct((1000,), jnp.int32))
    module = lower(jax.value_and_grad(loss, argnums=(0, 1)), platform, *shapes)
    marker = "tpu_custom_call" if platform == "tpu" else "triton"
    assert module.count(marker) >= (3 if platform == "tpu" else 2)
