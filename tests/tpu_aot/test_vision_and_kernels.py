"""The vision tower over several images and the Pallas kernels, compiled for TPU: on v5p and v6e the tower with
splash and the kernels the stages call on one chip compile.

That the same tower program's FLOPs grow linearly with the number of images is checked on XLA:CPU's compile of it
(tests/models/test_vision_window.py): the count is a property of the program we write, and four TPU compiles of it
cost about 4 minutes of the suite's CPU where four CPU compiles cost 15 s."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from kernels.grouped_advantage import Gates, grouped_arrays_pallas
from kernels.token_logprobs_tpu import token_logprobs_tpu
from rmsweb_jax.plan import programs, tpu_aot
from tests.tpu_aot.slices import model_config, slice_config

pytestmark = [pytest.mark.tpu_aot, pytest.mark.slow]
PATCHES = 256  # per image: a 256x256 picture (16 x 16 patches of 16); small, so that each compile is quick


def _devices(chip, chips):
    try:
        return tpu_aot.topology_devices(chip, chips)
    except tpu_aot.LibtpuUnavailable as err:
        pytest.skip(f"libtpu cannot load here: {err}")


def _vision_flops(images: int, window: int, impl: str, chip: str) -> float:
    config = slice_config("8b", chip, (1, 2, 2))
    config.model.vision_window, config.model.attention_impl = window, impl
    devices = _devices(chip, 4)
    mesh = Mesh(np.array(devices).reshape(1, 2, 2), ("data", "fsdp", "tensor"))
    from rmsweb_jax.models.from_config import rules_from_config
    program = programs.vision_tower(config, model_config("8b"), mesh, rules_from_config(config), images, PATCHES)
    return tpu_aot.compile_program(program.name, program.fn, program.args).flops


@pytest.mark.parametrize("chip", ("v5p", "v6e"))
def test_vision_tower_with_splash_compiles_per_image(chip):
    assert _vision_flops(4, PATCHES, "splash", chip) > 0


def _one_chip(shape, dtype, chip):
    device = _devices(chip, 4)[0]  # one chip of the smallest host of that generation
    sharding = NamedSharding(Mesh(np.array([device]), ("x",)), PartitionSpec())
    return jax.ShapeDtypeStruct(shape, dtype, sharding=sharding)


@pytest.mark.parametrize("chip", ("v5p", "v6e"))
def test_pallas_token_logprobs_compiles_for_tpu(chip):
    cfg = model_config("8b").text
    fn = jax.jit(jax.value_and_grad(lambda h, w, y: token_logprobs_tpu(h, w, y)[0].sum(), argnums=(0, 1)))
    args = (_one_chip((2048, cfg.hidden_size), jnp.bfloat16, chip),
            _one_chip((cfg.hidden_size, cfg.vocab_size), jnp.bfloat16, chip), _one_chip((2048,), jnp.int32, chip))
    rep = tpu_aot.compile_program("token_logprobs_tpu", fn, args)
    assert "tpu_custom_call" in rep.hlo and rep.peak_bytes > 0


@pytest.mark.parametrize("chip", ("v5p", "v6e"))
def test_pallas_grouped_advantages_compile_for_tpu(chip):
    fn = jax.jit(lambda r, m: grouped_arrays_pallas(r, m, Gates(), "tpu", False, None))
    args = (_one_chip((256, 8), jnp.float32, chip), _one_chip((256, 8), jnp.float32, chip))
    rep = tpu_aot.compile_program("grouped_advantages", fn, args)
    assert "tpu_custom_call" in rep.hlo
