"""The memory planner (rmsweb_jax/plan/) against the real sharded arrays and XLA's compiled memory analysis of
a small model on the 8 host CPU devices of tests/conftest.py, and the 8B / 32B presets it sizes."""
import dataclasses
import importlib.util
import os
import pathlib
import re
import subprocess
import sys

import jax
import numpy as np
import pytest

from configs.common import base_config
from rmsweb_jax.errors import UserError
from rmsweb_jax.models import qwen3_vl, sharding
from rmsweb_jax.models.qwen3_vl.config import RuntimeOptions, tiny
from rmsweb_jax.plan import chips, memory, tpu_aot
from rmsweb_jax.plan.planner import Plan, StagePlan, plan
from rmsweb_jax.train import batch as batch_lib
from rmsweb_jax.train.loss import make_sft_loss
from rmsweb_jax.train.optimizer import OptimizerConfig, make_optimizer
from rmsweb_jax.train.step import ModelParts, TrainStep, init_train_state, param_shardings, train_state_shardings
from rmsweb_jax.train.synthetic_batches import random_examples

REPO = pathlib.Path(__file__).resolve().parents[1]

PRESETS = [f"qwen3_vl_{size}_{stage}:{chip}" for size in ("8b", "32b") for stage in ("sft", "salvage")
           for chip in ("v5p", "v6e")]


def _small_config(mesh_shape, remat):
    """Returns a config of a small model (4 layers of 128, 1024-token vocabulary) on `mesh_shape`."""
    c = base_config()
    c.mesh.shape = mesh_shape
    c.model.remat_policy = remat
    c.model.attention_impl = "xla"
    c.train.batch_size = 16
    c.train.optimizer.weight_decay = 0.01
    return c


def _small_model():
    return tiny(hidden_size=128, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                vocab_size=1024)


def _real_state(config, model_config):
    mesh = sharding.make_mesh(config.mesh.shape)
    runtime = RuntimeOptions(remat_policy=config.model.remat_policy, attention_impl="xla")
    model = qwen3_vl.create(model_config, runtime, mesh=mesh)
    parts = ModelParts.split(model)
    tx = make_optimizer(OptimizerConfig.from_config(config.train.optimizer))
    p_sh = param_shardings(model, mesh)
    shardings = train_state_shardings(parts.params, tx, mesh, p_sh)
    return mesh, parts, tx, p_sh, shardings, init_train_state(parts.params, tx, 0, shardings)


def _device_bytes(tree, device) -> int:
    return sum(s.data.nbytes for x in jax.tree.leaves(tree) for s in x.addressable_shards if s.device == device)


@pytest.mark.parametrize("mesh_shape", [(2, 2, 2), pytest.param((1, 8, 1), marks=pytest.mark.slow),
                                        pytest.param((1, 2, 4), marks=pytest.mark.slow)])
def test_parameter_and_optimizer_bytes_per_device_equal_the_real_shards(mesh_shape):
    config, model_config = _small_config(mesh_shape, "none"), _small_model()
    *_, state = _real_state(config, model_config)
    planned = memory.state_bytes(model_config, config, memory.abstract_mesh(memory.mesh_shape(mesh_shape, 8)))
    for device in jax.devices():
        assert _device_bytes(state.params, device) == planned["params"]
        assert _device_bytes(state.opt_state, device) == planned["optimizer"]
        assert _device_bytes(state.params["text"], device) == planned["text_params"]


def _compiled_temp_bytes(config, model_config, rows: int, seq_len: int) -> int:
    mesh, parts, tx, p_sh, shardings, state = _real_state(config, model_config)
    step = TrainStep(parts._replace(params=None), make_sft_loss("chunked"), tx, mesh=mesh, p_shardings=p_sh,
                     shardings=shardings)
    examples = random_examples(model_config, count=rows, seq_len=seq_len)
    host = {k: np.stack([e[k] for e in examples]) for k in examples[0]}
    batch = batch_lib.prepare_batch(host, model_config, 1, rows=rows, mesh=mesh)
    placed = batch_lib.to_global(batch, batch_lib.batch_shardings(batch, mesh, sharding.DEFAULT_RULES))
    return step.jitted(placed).lower(state, placed).compile().memory_analysis().temp_size_in_bytes


def _planned_temp_bytes(config, model_config, rows: int, seq_len: int) -> int:
    mesh = memory.abstract_mesh(memory.mesh_shape(config.mesh.shape, 8))
    state = memory.state_bytes(model_config, config, mesh)
    runtime = dataclasses.replace(memory.runtime_for(config, "cpu", seq_len), param_dtype="float32")
    local = memory.local_model_config(model_config, mesh, sharding.DEFAULT_RULES)
    dp = mesh.shape["data"] * mesh.shape["fsdp"]
    return state["params"] + memory.activation_bytes(local, runtime, rows // dp, seq_len, 0)


@pytest.mark.parametrize("mesh_shape,remat", [
    ((1, 8, 1), "full"),
    pytest.param((2, 2, 2), "none", marks=pytest.mark.slow),
    pytest.param((2, 2, 2), "dots_with_no_batch_dims", marks=pytest.mark.slow),
    pytest.param((1, 4, 2), "save_attention_out", marks=pytest.mark.slow),
])
def test_step_temporaries_within_25_percent_of_xla_memory_analysis(mesh_shape, remat):
    config, model_config = _small_config(mesh_shape, remat), _small_model()
    compiled = _compiled_temp_bytes(config, model_config, rows=16, seq_len=256)
    planned = _planned_temp_bytes(config, model_config, rows=16, seq_len=256)
    assert abs(planned - compiled) <= 0.25 * compiled, (planned, compiled)


def _preset(name: str):
    file, arg = name.split(":")
    spec = importlib.util.spec_from_file_location(file, REPO / "configs" / f"{file}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config(arg)


@pytest.mark.parametrize("name", [p if p == "qwen3_vl_8b_salvage:v6e" else pytest.param(p, marks=pytest.mark.slow)
                                  for p in PRESETS])
def test_every_preset_fits_its_slice(name):
    config = _preset(name)
    result = plan(config, chip_name=config.plan.chip, topology=config.plan.topology, mfu=0.4, usable_fraction=0.9,
                  config_name=name)
    result.check_fits()  # raises with the figures
    assert result.devices == {"v5p-64": 32, "v5p-128": 64, "v6e-64": 64}[config.plan.topology]
    train = [s for s in result.stages if s.stage in ("sft", "salvage")]
    assert train and all(s.activations > 0 and s.gradients > 0 and s.flops > 0 for s in train)
    if "salvage" in name:
        assert [s.stage for s in result.stages] == ["mine", "salvage"]
        assert all(s.kv_cache > 0 for s in result.stages)


def test_the_salvage_plan_uses_salvage_s_own_batch():
    config = _preset("qwen3_vl_8b_salvage:v6e")
    kwargs = dict(chip_name=config.plan.chip, topology=config.plan.topology, mfu=0.4, usable_fraction=0.9)
    base = {s.stage: s for s in plan(config, **kwargs).stages}["salvage"]
    config.salvage.train.batch_size = 2 * config.train.batch_size
    doubled = {s.stage: s for s in plan(config, **kwargs).stages}["salvage"]
    assert doubled.flops == pytest.approx(2 * base.flops, rel=1e-6)  # the step's FLOPs scale with its rows


def test_the_ground_stage_is_planned_as_sft_at_its_own_batch():
    config = _preset("qwen3_vl_8b_sft:v6e")
    config.stages = ("ground", "sft")
    kwargs = dict(chip_name=config.plan.chip, topology=config.plan.topology, mfu=0.4, usable_fraction=0.9)
    stages = {s.stage: s for s in plan(config, **kwargs).stages}
    assert stages["ground"].train_peak == stages["sft"].train_peak  # ground.train's None: config.train's batch
    assert stages["ground"].flops == stages["sft"].flops
    config.ground.train.batch_size = 2 * config.train.batch_size
    doubled = {s.stage: s for s in plan(config, **kwargs).stages}
    assert doubled["ground"].flops == pytest.approx(2 * stages["sft"].flops, rel=1e-6)
    assert doubled["ground"].activations > stages["sft"].activations
    assert doubled["sft"].flops == stages["sft"].flops  # SFT keeps config.train's


def test_the_group_kv_cache_is_one_prompt_plus_g_own_caches():
    """Salvage samples G per prompt: under group_decode "cascade" the plan counts each prompt's cache once and G
    rows of max_new slots; "copy" counts the prompt's cache and its G copies (prompt + max_new slots each)."""
    config = _preset("qwen3_vl_8b_salvage:v6e")
    kwargs = dict(chip_name=config.plan.chip, topology=config.plan.topology, mfu=0.4, usable_fraction=0.9)

    def kv(group_decode):
        config.model.group_decode = group_decode
        return {s.stage: s for s in plan(config, **kwargs).stages}["salvage"].kv_cache

    group, max_new = int(config.salvage.group_size), int(config.salvage.max_new_tokens)
    bucket = memory.prompt_bucket(max(max(config.data.buckets) - max_new, 1))
    assert group > 1
    cascade, copy = kv("cascade"), kv("copy")
    # Per (row, slot) the bytes are the same on both paths; prompts P, G rows each:
    # cascade P*bucket + P*G*max_new, copy P*(bucket + max_new) + P*G*(bucket + max_new).
    slots_cascade, slots_copy = bucket + group * max_new, (1 + group) * (bucket + max_new)
    assert cascade * slots_copy == pytest.approx(copy * slots_cascade, rel=1e-9), (cascade, copy)
    assert cascade < copy / 2


def test_an_oversize_config_is_refused_with_its_figures():
    # The v6e 8B preset on 8 chips instead of 64: the fp32 state alone is 16 GB a chip.
    config = _preset("qwen3_vl_8b_sft:v6e")
    result = plan(config, chip_name="v6e", topology="v6e-8", mfu=0.4, usable_fraction=0.9, config_name="oversize")
    assert not result.fits() and re.search(r"\sNO\s", result.table())
    sft = result.stages[0]
    # fp32 weights over fsdp 1 x tensor 8 (the vision tower's 27 x 1152 blocks partly replicated), AdamW's two
    # moments like them, and with 8 microbatches a gradient accumulator beside each microbatch's gradients.
    assert result.parameters * 4 / 8 <= sft.params <= 1.01 * result.parameters * 4 / 8
    assert 0 <= sft.optimizer - 2 * sft.params <= 64  # + the schedule's step counts
    assert sft.gradients == 2 * sft.params
    with pytest.raises(UserError, match=r"oversize: stage sft needs [0-9.]+ GiB per device \(params 4.10, optimizer "
                                        r"8.20, gradients 8.20, activations [0-9.]+, .*\) but a v6e gives 26.82 GiB"):
        result.check_fits()


@pytest.mark.slow
def test_the_command_line_prints_the_table_and_exits_2_when_it_does_not_fit():
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=1")
    out = subprocess.run([sys.executable, "-m", "rmsweb_jax.plan", "--config=configs/qwen3_vl_8b_sft.py:v6e",
                          "--topology=v6e-8", "--nopropose_mesh"], cwd=REPO, env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 2, out.stdout + out.stderr[-3000:]
    assert "configs/qwen3_vl_8b_sft.py:v6e on 8 x v6e" in out.stdout
    assert re.search(r"\sNO\s", out.stdout)
    assert "stage sft needs" in out.stderr and "but a v6e gives 26.82 GiB (90% of 29.8)" in out.stderr


def test_topologies_and_chips():
    assert chips.device_count(chips.chip("v5p"), "v5p-64") == 32
    assert chips.device_count(chips.chip("v6e"), "v6e-16") == 16
    assert chips.device_count(chips.chip("v5e"), "v5litepod-8") == 8
    assert chips.device_count(chips.chip("v5p"), "4x4x4") == 64
    assert chips.device_count(chips.chip("h200"), "8") == 8
    with pytest.raises(UserError, match="names a v6e slice but --chip='v5p'"):
        chips.device_count(chips.chip("v5p"), "v6e-8")
    with pytest.raises(UserError, match="unknown chip"):
        chips.chip("v7x")
    with pytest.raises(UserError, match=r"config.mesh.shape = \(1, -1, 3\): 32 devices are not divisible by 3"):
        memory.mesh_shape((1, -1, 3), 32)


def test_one_device_plan_counts_the_first_decode_compaction():
    """On one device the sampler compacts finished rows (model.decode_compaction): at the first compaction the loop's
    cache and its live half are both alive. On a mesh the rows keep their places and the plan is unchanged."""
    config = _preset("qwen3_vl_8b_salvage:v6e")
    group, max_new = int(config.salvage.group_size), int(config.salvage.max_new_tokens)

    def kv(topology, compaction):
        config.model.decode_compaction = compaction
        config.mesh.shape = (1, -1, 1)
        stages = plan(config, chip_name="h200", topology=topology, mfu=0.4, usable_fraction=0.9).stages
        return {s.stage: s for s in stages}["salvage"].kv_cache

    bucket = memory.prompt_bucket(max(max(config.data.buckets) - max_new, 1))
    one, one_kept = kv("1", 2), kv("1", 0)
    # cascade: the prompts' cache (P x bucket slots) and the rows' own (P*G x max_new), the own half again on top
    slots = bucket + group * max_new
    assert one * slots == pytest.approx(one_kept * (slots + group * max_new // 2), rel=1e-6), (one, one_kept)
    assert kv("8", 2) == kv("8", 0)


def test_a_compile_report_is_of_the_optimized_program_and_gives_the_setting_back():
    """make test sets jax_disable_most_optimizations for its XLA:CPU programs (tests/conftest.py); a CompileReport
    is of the program a TPU VM compiles, at full optimization, and the process's setting is back afterwards, also
    when the compile fails."""
    seen = []

    def doubling():
        def f(x):  # a new function each time, so that jit traces it (and it records the setting) each time
            seen.append(jax.config.read("jax_disable_most_optimizations"))
            return x * 2.0
        return f

    def broken(x):
        raise ValueError("a program that does not trace")

    args = (jax.ShapeDtypeStruct((4,), np.float32),)
    before = jax.config.read("jax_disable_most_optimizations")
    try:
        for setting in (True, False):
            jax.config.update("jax_disable_most_optimizations", setting)
            report = tpu_aot.compile_program("double", jax.jit(doubling()), args, platform="cpu")
            assert seen.pop() is False and report.flops > 0
            assert jax.config.read("jax_disable_most_optimizations") is setting
            with pytest.raises(ValueError, match="does not trace"):
                tpu_aot.compile_program("broken", jax.jit(broken), args, platform="cpu")
            assert jax.config.read("jax_disable_most_optimizations") is setting
    finally:
        jax.config.update("jax_disable_most_optimizations", before)


def _hand_count_8b_v5p_device_flops() -> float:
    """Returns the 8B SFT step's FLOPs on one device of v5p-64 (mesh 1 x 16 x 2), counted by hand from the
    architecture (BUILD.md writes the same sum out): 2 FLOPs a weight a token (patch) a pass; passes: forward,
    backward (2) and save_attention_out's recompute of every layer and vision block (splash's log-sum-exp is not
    saved); the LM head 3 passes. Text divides by all 32 devices; the vision tower's patches are replicated, its
    weights cut 16 (fsdp) x 2 (tensor) ways and its attention only by the 2 head shards."""
    arch = qwen3_vl.preset("8b")
    t, v = arch.text, arch.vision
    tokens, seq, patches, image = 64 * 8192, 8192, 64 * 2 * 4096, 4096
    layer_weights = t.hidden_size * t.head_dim * (2 * t.num_attention_heads + 2 * t.num_key_value_heads) \
        + 3 * t.hidden_size * t.intermediate_size
    text = tokens * 4 * t.num_hidden_layers * (2 * layer_weights + 2 * seq * t.head_dim * t.num_attention_heads)
    head = tokens * 3 * 2 * t.hidden_size * t.vocab_size
    block_weights = 4 * v.hidden_size ** 2 + 2 * v.hidden_size * v.intermediate_size
    vision = patches * 4 * v.depth * (2 * block_weights / 32 + 2 * 2 * image * v.hidden_size / 2)
    return (text + head) / 32 + vision  # the patch embedding and mergers (< 1%) left out


def test_the_8b_v5p_step_flops_per_device_are_within_25_percent_of_the_hand_count():
    config = _preset("qwen3_vl_8b_sft:v5p")
    result = plan(config, chip_name="v5p", topology="v5p-64", mfu=1.0, usable_fraction=0.9)
    sft = result.stages[0]
    hand = _hand_count_8b_v5p_device_flops()
    assert abs(sft.time.device_flops - hand) <= 0.25 * hand, (sft.time.device_flops / 1e12, hand / 1e12)
    assert sft.device_flops == sft.time.device_flops
    # the model FLOPs (3 passes, nothing recomputed or replicated) are below what the devices run
    assert sft.flops / result.devices < sft.time.device_flops
    assert sft.time.mfu_ceiling == pytest.approx(sft.flops / (32 * 459e12 * sft.time.step_s))


def test_v6e_tensor_8_all_reduces_and_the_overlap_flags():
    """v6e's tensor-8 8B step: 2 all-reduces of [tokens x hidden] bf16 a layer a forward pass, 2 a backward, 2 in
    the recompute, 8 microbatches x 36 layers, at 224 GB/s (one torus dimension of a 3,584 Gbps chip); the step
    is collective-bound, and without the overlap flags the weight gathers add to it too."""
    config = _preset("qwen3_vl_8b_sft:v6e")
    kwargs = dict(chip_name="v6e", topology="v6e-64", mfu=1.0, usable_fraction=0.9)
    assert chips.axis_bytes_per_s(chips.chip("v6e"), 64, 8) == pytest.approx(224e9)
    with_flags = plan(config, **kwargs)
    sft = with_flags.stages[0].time
    assert with_flags.overlap and sft.collective_bound
    tensor_bytes = 8 * 36 * 6 * 8192 * 4096 * 2 * 2 * 7 / 8
    assert sft.activation_bytes >= tensor_bytes  # + the vision tower's all-reduces
    assert sft.exposed_s >= tensor_bytes / 224e9
    assert sft.step_s == pytest.approx(max(sft.compute_s, sft.overlappable_s) + sft.exposed_s)
    config.tpu.libtpu_init_args = ""
    without = plan(config, **kwargs)
    plain = without.stages[0].time
    assert not without.overlap
    assert plain.step_s == pytest.approx(sft.compute_s + sft.overlappable_s + sft.exposed_s)
    assert plain.step_s > sft.step_s and plain.mfu_ceiling < sft.mfu_ceiling


@pytest.mark.parametrize("name", ["qwen3_vl_8b_sft:v6e", pytest.param("qwen3_vl_32b_sft:v6e", marks=pytest.mark.slow)])
def test_v6e_presets_use_the_mesh_the_planner_proposes(name):
    from rmsweb_jax.plan import meshes
    config = _preset(name)
    options = meshes.propose_mesh(config, chip_name="v6e", topology=config.plan.topology, mfu=1.0,
                                  usable_fraction=0.9)
    best = meshes.best_mesh(options)
    assert best is not None, meshes.mesh_table(options)
    assert (tuple(config.mesh.shape), int(config.train.microbatches)) == (best.mesh, best.microbatches), \
        meshes.mesh_table(options)
    assert [o.mesh for o in options] == list(meshes.MESH_CANDIDATES)


def test_what_stays_resident_is_added_beside_each_program():
    """A Salvage-DS stage keeps its optimizer state while it samples and a KL reference throughout: both count
    beside the sampler's program, in the plan's peak and against a compiled program's peak."""
    g = 1024 ** 3
    stage = StagePlan("salvage", params=4 * g, optimizer=8 * g, gradients=4 * g, activations=2 * g, kv_cache=6 * g,
                      extra=4 * g, flops=1.0, step_s=1.0, prefill=1 * g)
    assert stage.train_peak == 18 * g and stage.sampling_peak == 11 * g
    assert stage.resident_beside("train_peak") == 4 * g  # the reference; the optimizer is the step's own
    assert stage.resident_beside("sampling_peak") == 12 * g
    assert stage.total == 23 * g  # the sampler's 11 + 12 over the step's 18 + 4
    result = Plan("c", chips.chip("v6e"), 1, {"data": 1, "fsdp": 1, "tensor": 1}, "a", 1, 1.0, 0.9, (stage,))
    assert result.fits() and 26 * g < result.budget < 27 * g
    result.check_compiled([("salvage", "train_peak", "salvage_step", 22 * g)])  # 22 + 4
    # 15 GiB alone fits the budget, but not with the optimizer state and the reference beside it
    with pytest.raises(UserError, match=r"program salvage_generate compiles to 15.00 GiB per device and stage "
                                        r"salvage keeps 12.00 GiB beside it"):
        result.check_compiled([("salvage", "sampling_peak", "salvage_generate", 15 * g)])


def test_the_presets_libtpu_flags_reach_libtpu_init_args_and_compile_options():
    from rmsweb_jax.distributed import compiler_options, libtpu_init_args
    config = _preset("qwen3_vl_8b_sft:v5p")
    flags = str(config.tpu.libtpu_init_args)
    options = compiler_options(flags)
    assert options["xla_tpu_enable_async_collective_fusion"] == "true"
    env = {"LIBTPU_INIT_ARGS": "--xla_tpu_enable_async_collective_fusion=false"}
    assert libtpu_init_args(flags, env) == env["LIBTPU_INIT_ARGS"]
    assert env["LIBTPU_INIT_ARGS"].startswith(flags)
    assert env["LIBTPU_INIT_ARGS"].endswith("fusion=false")  # the user's own flag last: libtpu keeps its value
    empty = {}
    assert libtpu_init_args("", empty) == "" and empty == {}
    with pytest.raises(UserError, match="config.tpu.libtpu_init_args: 'xla_a=1' is not --name=value"):
        compiler_options("--xla_b=2 xla_a=1")


@pytest.mark.slow
def test_mine_rollouts_on_several_hosts_count_each_host_s_own_policy_copy():
    # 32B on v6e-64: the host's copy in bf16 over its 4 chips (mesh (1, 1, 4): no FSDP, so no second decode copy).
    config = _preset("qwen3_vl_32b_salvage:v6e")
    kwargs = dict(chip_name="v6e", topology="v6e-64", mfu=1.0, usable_fraction=0.9)
    config.stages = ("mine",)
    (without,) = plan(config, **kwargs).stages
    config.mine.rollouts = True
    (mine,) = plan(config, **kwargs).stages
    assert without.host_copy == 0
    weights = qwen3_vl.parameter_count(qwen3_vl.preset("32b")) * 2 / 4  # bf16 over 4 chips
    assert weights <= mine.host_copy <= 1.1 * weights, (mine.host_copy, weights)
    assert mine.total == max(without.total, mine.host_copy)
    assert any("rollouts: each host samples its own copy on its 4 chips, mesh (1, 1, 4)" in n for n in mine.notes)
    # One host (4 chips): the rollouts sample the stage's own model, nothing more.
    config.mesh.shape = (1, -1, 4)
    (one_host,) = plan(config, chip_name="v6e", topology="v6e-4", mfu=1.0, usable_fraction=0.9).stages
    assert one_host.host_copy == 0
