"""The presets' libtpu flags (config.tpu.libtpu_init_args) reach the TPU compiler and make its collectives async:
mining's reference log-prob forward at 8B widths (2 layers, text only) on a 4-chip v5p slice, FSDP over all 4,
compiled with and without them. With them, the layers' weight all-gathers are async collective fusions (XLA names
each async_collective_name="all-gather-start..."), which the latency-hiding scheduler runs under the previous
matmuls; without them, plain blocking all-gathers."""
import re

import pytest

from rmsweb_jax.distributed import compiler_options
from rmsweb_jax.plan import compiled, tpu_aot
from rmsweb_jax.plan.hlo import instructions
from tests.tpu_aot.slices import CompiledSlice

pytestmark = [pytest.mark.tpu_aot, pytest.mark.slow]

ASYNC = re.compile(r'async_collective_name="(all-gather|all-reduce|reduce-scatter)-start')


def _hlo(sl: CompiledSlice, options: dict) -> str:
    built = compiled.build("mine_logprobs", sl.config, sl.model_config, sl.mesh, sl.rules, sl.plan.chip.hbm_bytes)
    return tpu_aot.compile_program("mine_logprobs", built.fn, built.args, compiler_options=options).hlo


def test_the_presets_flags_make_the_weight_gathers_async():
    # v5p only: v6e's compile of the same program takes ~3x longer here, and its flags share the async-fusion set.
    sl = CompiledSlice("8b", "v5p", 4, (1, 4, 1), stages=("mine",))
    sl.config.data.bucket_patches = (0,)  # text only: the layers' gathers are what the flags are for
    options = compiler_options(str(sl.config.tpu.libtpu_init_args))
    assert options["xla_tpu_enable_async_collective_fusion"] == "true"
    with_flags, without = _hlo(sl, options), _hlo(sl, {})
    assert instructions(without, "all-gather"), "no weight all-gather in the FSDP forward"
    assert not ASYNC.search(without), "async collectives without the flags: the test shows nothing"
    assert len(ASYNC.findall(with_flags)) >= 2, "the preset's flags made no collective async"
