"""The HLO reader (plan/hlo.py: read_module and the functions over it) and a program's weighted work (plan/hlo_work.py).

A Mosaic kernel call's attributes span lines, and the continuation lines start with `}`: the reader must keep every
instruction after one. Checked on a hand-written module (the grammar's corner cases, an exact count of the work) and
on real TPU programs with splash kernels, against the compiled module's own instruction list (HloModule API) and
against a hand count of their matmuls."""
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from rmsweb_jax.models import attention
from rmsweb_jax.plan import tpu_aot
from rmsweb_jax.plan.hlo import computations, instructions, parse_instruction, read_module, result_bytes
from rmsweb_jax.plan.hlo_work import weighted_work
from tests.tpu_aot.slices import LOOP_WITH_KERNEL_HLO as HLO  # 36 trips of a kernel, a gather, a dot


def test_the_reader_keeps_every_instruction_after_a_multiline_kernel_call():
    comps = computations(HLO)
    names = [parse_instruction(t).name for t in comps["body"]]
    assert names == ["arg", "i", "x", "my_kernel.3", "all-gather.1", "fusion.1", "one", "next", "tuple.1"]
    assert set(comps) == {"fused_dot", "body", "cond", "main"} and read_module(HLO).entry == "main"
    kernel = comps["body"][3]
    assert kernel.count("\n") == 2 and 'a } and a { in a string' in kernel and kernel.endswith('"QUJD"}}')
    gathers = instructions(HLO, "all-gather", scope="layers")
    assert len(gathers) == 1 and result_bytes(gathers[0]) == 8 * 64 * 4
    report = tpu_aot.CompileReport("planted", 0.0, 0, 0, 0, 0, 0.0, HLO)
    assert report.count("all-gather", scope="layers", min_bytes=2048) == 1
    assert report.count("all-gather", scope="layers", min_bytes=2049) == 0


def test_a_module_cut_inside_a_computation_is_refused_naming_it():
    with pytest.raises(ValueError, match="ends inside computation 'body' with 3 braces open"):
        read_module(HLO[:HLO.index('"xprof_metadata"')])
    with pytest.raises(ValueError, match="not an HLO instruction"):
        parse_instruction("just words")


def test_an_async_gather_delivers_its_gathered_array_not_its_shard():
    start = ("%all-gather-start.2 = (bf16[4,8]{1,0:T(8,128)(2,1)}, bf16[4,64]{1,0:T(8,128)(2,1)}) "
             "all-gather-start(%p.1), channel_id=2, replica_groups=[1,8]<=[8], dimensions={1}")
    assert result_bytes(start) == 4 * 64 * 2
    permute = ("%collective-permute-start.1 = (f32[16]{0}, f32[16]{0}, u32[]{:S(2)}, u32[]{:S(2)}) "
               "collective-permute-start(%p.2), channel_id=3, source_target_pairs={{0,1},{1,0}}")
    assert result_bytes(permute) == 64


def test_weighted_work_counts_the_loop_body_once_per_trip():
    work = weighted_work(HLO)
    assert work.flops == 36 * 2 * 8 * 8 * 8
    assert work.kernel_calls == {"my_kernel": 36} and work.unknown_kernels == ("my_kernel",)
    assert work.collective_bytes == {"all-gather": 36 * 8 * 64 * 4}
    assert work.unknown_trip_counts == () and work.bounded_trip_counts == ()


def test_a_loop_with_a_data_dependent_exit_is_counted_at_its_bound_and_one_unread_once():
    bounded = HLO.replace("  ROOT %lt = pred[] compare(%i, %n), direction=LT",
                             "  %lt = pred[] compare(%i, %n), direction=LT\n  %done = pred[] constant(false)\n"
                             "  ROOT %and = pred[] and(%lt, %done)")
    work = weighted_work(bounded)
    assert work.flops == 36 * 2 * 8 * 8 * 8 and work.bounded_trip_counts == ("while.1",)
    unread = HLO.replace("%init = (s32[], f32[8,8]{1,0}) tuple(%zero, %x)",
                            "%init = (s32[], f32[8,8]{1,0}) parameter(1)")
    work = weighted_work(unread)
    assert work.flops == 2 * 8 * 8 * 8 and work.unknown_trip_counts == ("while.1",)


# ---- real TPU programs ----------------------------------------------------------------------------------------


def _one_chip(shape, dtype):
    try:
        device = tpu_aot.topology_devices("v5p", 4)[0]
    except tpu_aot.LibtpuUnavailable as err:
        pytest.skip(f"libtpu cannot load here: {err}")
    sharding = NamedSharding(Mesh(np.array([device]), ("x",)), PartitionSpec())
    return jax.ShapeDtypeStruct(shape, dtype, sharding=sharding)


LAYERS, HEADS, T, D = 3, 2, 256, 128


def _splash_layers():
    """Returns (the jitted gradient of LAYERS scanned layers, each x @ w then causal splash attention, its args)."""
    width = HEADS * D

    def loss(x, ws):
        def layer(x, w):
            q = (x @ w).reshape(1, T, HEADS, D)
            seg = jnp.ones((1, T), jnp.int32)
            out = attention.attention(q, q, q, q_segment_ids=seg, kv_segment_ids=seg, causal=True, impl="splash")
            return out.reshape(1, T, width), None
        return jax.lax.scan(layer, x, ws)[0].astype(jnp.float32).sum()

    return jax.jit(jax.grad(loss, argnums=1)), (_one_chip((1, T, width), jnp.bfloat16),
                                                _one_chip((LAYERS, width, width), jnp.bfloat16))


@pytest.mark.tpu_aot
def test_the_reader_keeps_every_instruction_of_a_tpu_program_with_splash_kernels():
    fn, args = _splash_layers()
    with jax.default_matmul_precision("default"):
        compiled = fn.trace(*args).lower(lowering_platforms=("tpu",)).compile()
    hlo = compiled.as_text()
    kernels = [t for lines in computations(hlo).values() for t in lines if "tpu_custom_call" in t]
    assert kernels and all(re.search(r"\n\s*\}", t) for t in kernels), "no multi-line kernel call with a '}' line"

    def opcode_enum(opcode: str) -> str:  # 'get-tuple-element' -> 'HloOpcode.kGetTupleElement'
        return "HloOpcode.k" + "".join(part.capitalize() for part in opcode.split("-"))

    module = compiled.runtime_executable().hlo_modules()[0]  # the compiled module's own instruction lists
    want = {c.name: sorted((i.name, str(i.opcode)) for i in c.instructions()) for c in module.computations()}
    got = {name: sorted((i.name, opcode_enum(i.opcode)) for i in insts)
           for name, insts in read_module(hlo).computations.items()}
    assert got == want


@pytest.mark.tpu_aot
def test_weighted_work_of_splash_layers_matches_the_hand_count():
    fn, args = _splash_layers()
    report = tpu_aot.compile_program("splash_layers", fn, args)
    work = report.work
    # x @ w forward, then dx and dw backward: 3 matmuls of 2 x T x width x width a layer.
    assert work.flops == LAYERS * 3 * 2 * T * (HEADS * D) ** 2
    # Splash per layer: forward 2 matmuls, dq 3, dkv 4, each 2 x heads x T x S x D (every block, causal or not).
    assert work.kernel_flops == LAYERS * (2 + 3 + 4) * 2 * HEADS * T * T * D
    assert work.kernel_calls == {"splash_mha_fwd_segmented_residuals": LAYERS,
                                 "splash_mha_dq_segmented_no_residuals": LAYERS,
                                 "splash_mha_dkv_segmented_no_residuals": LAYERS}
    assert work.unknown_kernels == () and work.unknown_trip_counts == ()
    # cost_analysis() counts each of the two loop bodies (forward, backward) once and no kernel.
    assert report.flops < work.flops / (LAYERS - 0.5)


@pytest.mark.tpu_aot
def test_weighted_work_of_a_scan_of_matmuls_is_trips_times_one_matmul():
    trips, m, k = 8, 256, 1024

    def chain(x, ws):
        return jax.lax.scan(lambda h, w: (jnp.tanh(h @ w), None), x, ws)[0]

    args = (_one_chip((m, k), jnp.bfloat16), _one_chip((trips, k, k), jnp.bfloat16))
    report = tpu_aot.compile_program("matmul_scan", jax.jit(chain), args)
    work = report.work
    assert work.flops == trips * 2 * m * k * k
    assert work.unknown_trip_counts == () and work.collective_bytes == {}
    assert report.flops == pytest.approx(2 * m * k * k, rel=0.05)  # the body once


@pytest.mark.tpu_aot
def test_an_async_collective_fusion_counts_its_gather_once():
    """With the v5p preset's flags XLA prints each overlapped weight gather in three fusions (start, the compute it
    hides under, done): the bytes must equal the plain program's and the hand count."""
    from configs.pod_slices import LIBTPU_FLAGS
    from rmsweb_jax.distributed import compiler_options
    try:
        devices = tpu_aot.topology_devices("v5p", 4)
    except tpu_aot.LibtpuUnavailable as err:
        pytest.skip(f"libtpu cannot load here: {err}")
    mesh = Mesh(np.array(devices), ("fsdp",))
    layers, rows, width = 4, 512, 2048

    def loss(x, ws):
        return jax.lax.scan(lambda h, w: (jnp.tanh(h @ w), None), x, ws)[0].sum()

    args = (jax.ShapeDtypeStruct((rows, width), jnp.bfloat16, sharding=NamedSharding(mesh, PartitionSpec("fsdp"))),
            jax.ShapeDtypeStruct((layers, width, width), jnp.bfloat16,
                                 sharding=NamedSharding(mesh, PartitionSpec(None, "fsdp"))))
    lowered = jax.jit(jax.grad(loss, argnums=1)).trace(*args).lower(lowering_platforms=("tpu",))
    plain = weighted_work(lowered.compile().as_text())
    flagged = lowered.compile(compiler_options=compiler_options(LIBTPU_FLAGS["v5p"]))
    assert "async_collective_fusion" in flagged.as_text(), "the flags made no async collective fusion"
    work = weighted_work(flagged.as_text())
    # Each layer's weight is gathered whole once forward and once for the backward's x-gradient.
    assert work.collective_bytes["all-gather"] == plain.collective_bytes["all-gather"] == 2 * layers * width ** 2 * 2
    assert work.flops == plain.flops == layers * 3 * 2 * (rows // 4) * width ** 2
