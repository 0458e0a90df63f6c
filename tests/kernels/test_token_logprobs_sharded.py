"""kernels.token_logprobs_sharded on 8 CPU devices: values and gradients against the naive
log-softmax on one device, and the compiled program's collectives and matmul dtypes."""
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from kernels import token_logprobs as tl
from kernels.token_logprobs_sharded import token_logprobs_sharded
from rmsweb_jax.models import sharding

MESHES = [(1, 8, 1), (2, 2, 2), (1, 1, 8), (1, 2, 4)]
B, L, D = 8, 5, 16
V = 8 * 37  # every tensor size divides it; no chunk width below does (a static tail chunk)


def make_inputs(v=V, dtype=jnp.float32, seed=0):
    rng = np.random.default_rng(seed)
    h = jnp.asarray(rng.normal(size=(B, L, D)), dtype)
    w = jnp.asarray(rng.normal(size=(D, v)) * 3 / np.sqrt(D), dtype)
    y = jnp.asarray(rng.integers(0, v, size=(B, L)), jnp.int32)
    return h, w, y


def specs(mesh, h, w, tied):
    """Returns (hidden_spec, lm_head_spec) as the model's rules give them (tied: from the
    embedding's ("vocab", "embed") layout, transposed)."""
    rules = sharding.DEFAULT_RULES
    hs = sharding.logical_to_spec(("batch", "seq", "embed"), rules, mesh, h.shape)
    if tied:
        emb = sharding.logical_to_spec(("vocab", "embed"), rules, mesh, w.shape[::-1])
        return hs, P(*(tuple(emb) + (None, None))[:2][::-1])
    return hs, sharding.logical_to_spec(("embed", "vocab"), rules, mesh, w.shape)


def loss_fn(fn, y, seed=1):
    """Returns loss(h, w) = sum(c1 * logp + c2 * entropy) for fixed random c1, c2."""
    rng = np.random.default_rng(seed)
    c1, c2 = (jnp.asarray(rng.normal(size=y.shape), jnp.float32) for _ in range(2))

    def loss(h, w):
        logp, ent = fn(h, w)
        return jnp.sum(c1 * logp) + jnp.sum(c2 * ent)

    return loss


def reference(y, temperature=1.0):
    def fn(h, w):
        logp, ent = tl.token_logprobs_reference(h.reshape(-1, h.shape[-1]), w, y.reshape(-1),
                                                temperature=temperature)
        return logp.reshape(y.shape), ent.reshape(y.shape)
    return fn


def sharded(mesh, hs, ws, y, temperature=1.0, block_v=16):
    def fn(h, w):
        return token_logprobs_sharded(h, w, y, mesh=mesh, hidden_spec=hs, lm_head_spec=ws,
                                      temperature=temperature, return_entropy=True, block_v=block_v)
    return fn


def place(mesh, x, spec):
    return jax.device_put(x, NamedSharding(mesh, spec))


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
@pytest.mark.parametrize("shape", MESHES, ids=lambda s: "x".join(map(str, s)))
def test_values_and_gradients_match_reference(shape, tied):
    mesh = sharding.make_mesh(shape)
    h, w, y = make_inputs()
    hs, ws = specs(mesh, h, w, tied)
    want = reference(y, 0.7)(h, w)
    want_grads = jax.grad(loss_fn(reference(y, 0.7), y), argnums=(0, 1))(h, w)
    hp, wp = place(mesh, h, hs), place(mesh, w, ws)
    got = jax.jit(sharded(mesh, hs, ws, y, 0.7))(hp, wp)
    got_grads = jax.jit(jax.grad(loss_fn(sharded(mesh, hs, ws, y, 0.7), y), argnums=(0, 1)))(hp, wp)
    for name, a, b in zip(("logp", "entropy", "d_hidden", "d_lm_head"), got + got_grads, want + want_grads):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5, rtol=1e-5, err_msg=name)
    assert got_grads[1].sharding.is_equivalent_to(wp.sharding, 2)  # dW comes back laid out like W


@pytest.mark.parametrize("hs, ws", [
    (P(None, None, None), P("fsdp", "tensor")),       # rows replicated, W sharded both ways
    (P("data", None, None), P(None, None)),           # W replicated
    (P("data", "fsdp", None), P("tensor", None)),     # rows over two dims, D over an axis rows skip
    (P(("data", "fsdp"), None, "tensor"), P("fsdp", "tensor")),  # hidden's D sharded: gathered
])
def test_other_layouts_match_reference(hs, ws):
    mesh = sharding.make_mesh((2, 2, 2))
    h, w, y = make_inputs(v=2 * 37)
    if len(hs) > 1 and hs[1] == "fsdp":
        h, y = h[:, :4], y[:, :4]  # L = 4 divides over 'fsdp'
    want = reference(y)(h, w) + jax.grad(loss_fn(reference(y), y), argnums=(0, 1))(h, w)
    fn = sharded(mesh, hs, ws, y, block_v=8)
    got = jax.jit(fn)(h, w) + jax.jit(jax.grad(loss_fn(fn, y), argnums=(0, 1)))(h, w)
    for name, a, b in zip(("logp", "entropy", "d_hidden", "d_lm_head"), got, want):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5, rtol=1e-5, err_msg=name)


def test_bf16_within_bf16_tolerance():
    mesh = sharding.make_mesh((2, 2, 2))
    h, w, y = make_inputs()
    hs, ws = specs(mesh, h, w, tied=False)
    hb, wb = h.astype(jnp.bfloat16), w.astype(jnp.bfloat16)
    # The reference sees the same bf16-rounded inputs, in float32: what is left is bf16 arithmetic.
    want = reference(y)(hb.astype(jnp.float32), wb.astype(jnp.float32))
    want_grads = jax.grad(loss_fn(reference(y), y), argnums=(0, 1))(hb.astype(jnp.float32), wb.astype(jnp.float32))
    fn = sharded(mesh, hs, ws, y)
    got = jax.jit(fn)(place(mesh, hb, hs), place(mesh, wb, ws))
    got_grads = jax.jit(jax.grad(loss_fn(fn, y), argnums=(0, 1)))(place(mesh, hb, hs), place(mesh, wb, ws))
    assert got_grads[0].dtype == jnp.bfloat16 and got_grads[1].dtype == jnp.bfloat16
    for name, a, b in zip(("logp", "entropy"), got, want):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=0.05, rtol=0.02, err_msg=name)
    for name, a, b in zip(("d_hidden", "d_lm_head"), got_grads, want_grads):
        a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
        np.testing.assert_allclose(a / np.abs(b).max(), b / np.abs(b).max(), atol=0.03, err_msg=name)


def test_token_logprobs_routes_chunked_on_a_mesh_to_the_sharded_path():
    mesh = sharding.make_mesh((2, 2, 2))
    h, w, y = make_inputs()
    hs, ws = specs(mesh, h, w, tied=False)
    got = tl.token_logprobs(h, w, y, impl="chunked", mesh=mesh, hidden_spec=hs, lm_head_spec=ws)
    text = jax.jit(lambda h, w: tl.token_logprobs(h, w, y, impl="chunked", mesh=mesh, hidden_spec=hs,
                                                  lm_head_spec=ws)).lower(h, w).as_text()
    assert "manual_computation" in text or "shard_map" in text
    np.testing.assert_allclose(np.asarray(got), np.asarray(reference(y)(h, w)[0]), atol=1e-5)
    with pytest.raises(ValueError, match="hidden_spec and lm_head_spec"):
        tl.token_logprobs(h, w, y, impl="chunked", mesh=mesh)


@pytest.mark.parametrize("hs, ws, v, match", [
    (P("tensor", None, None), P("fsdp", "tensor"), V, "also shard lm_head's vocabulary"),
    (P(None, None, None), P("fsdp", "nope"), V, "not in the mesh"),
    (P(None, None, None), P(None, ("data", "fsdp", "tensor")), 292, "lm_head's V = 292 is not divisible"),
])
def test_bad_layouts_raise_value_error(hs, ws, v, match):
    mesh = sharding.make_mesh((2, 2, 2))
    h, w, y = make_inputs(v=v)
    with pytest.raises(ValueError, match=match):
        token_logprobs_sharded(h, w, y, mesh=mesh, hidden_spec=hs, lm_head_spec=ws)


def compiled_value_and_grad(block_v, dtype=jnp.bfloat16):
    mesh = sharding.make_mesh((2, 2, 2))
    hs, ws, ys = P(("data", "fsdp"), None, None), P("fsdp", "tensor"), P(("data", "fsdp"), None)
    d, v = 64, 1024
    sds = lambda shape, dt, spec: jax.ShapeDtypeStruct(shape, dt, sharding=NamedSharding(mesh, spec))
    args = (sds((8, 16, d), dtype, hs), sds((d, v), dtype, ws), sds((8, 16), jnp.int32, ys))

    def loss(h, w, y):
        return jnp.sum(token_logprobs_sharded(h, w, y, mesh=mesh, hidden_spec=hs, lm_head_spec=ws,
                                              block_v=block_v)[0])

    lowered = jax.jit(jax.value_and_grad(loss, argnums=(0, 1))).lower(*args)
    return lowered, (d, v // 2)  # the gathered W: whole along D, half the vocabulary


@pytest.mark.parametrize("block_v", [8, 96, 512])
def test_w_is_gathered_at_most_twice_whatever_the_chunk_count(block_v):
    lowered, (d, v_local) = compiled_value_and_grad(block_v)
    text = lowered.compile().as_text()
    gathers = re.findall(r"= (\w+)\[(\d+),(\d+)\]\{[^}]*\} all-gather(?:-start)?\(", text)
    of_w = [g for g in gathers if (int(g[1]), int(g[2])) == (d, v_local)]
    assert 1 <= len(of_w) <= 2, gathers  # 128 chunks at block_v=8: a per-chunk gather would show
    assert len(gathers) == len(of_w), gathers  # nothing else is gathered


def test_loop_dots_take_bf16_operands_with_f32_accumulation():
    # XLA:CPU widens bf16 dots to f32 when it compiles them, so the check reads the program handed
    # to XLA (what TPU and GPU compile as is): every dot in the loops multiplies bf16 into f32.
    lowered, _ = compiled_value_and_grad(block_v=96)
    dots = re.findall(r"stablehlo\.dot_general .*?: \((tensor<[^>]+>), (tensor<[^>]+>)\) -> (tensor<[^>]+>)",
                      lowered.as_text())
    assert len(dots) >= 3, dots  # forward logits; backward logits, dh and dW
    for lhs, rhs, out in dots:
        assert lhs.endswith("xbf16>") and rhs.endswith("xbf16>") and out.endswith("xf32>"), (lhs, rhs, out)
