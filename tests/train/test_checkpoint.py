"""Orbax checkpoints: sharded state, JSON or bytes iterator state, keep-K, restore onto another mesh."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from rmsweb_jax.models import sharding
from rmsweb_jax.train.checkpoint import Checkpointer
from rmsweb_jax.train.step import abstract_train_state


def _state(mesh, spec):
    put = lambda x, s: jax.device_put(x, NamedSharding(mesh, s))  # noqa: E731
    params = {"w": put(jnp.arange(64.0).reshape(8, 8), spec), "b": put(jnp.ones(8), P())}
    return {"step": put(jnp.int32(3), P()), "params": params, "rng": put(jax.random.PRNGKey(7), P())}


def test_save_keep_and_restore_onto_another_mesh(tmp_path):
    mesh = sharding.make_mesh((2, 2, 2))
    state = _state(mesh, P("fsdp", "tensor"))
    with Checkpointer(tmp_path / "ckpt", every_steps=2, keep=2) as ck:
        assert ck.latest_step() is None and not ck.due(1) and ck.due(4)
        for step, data in ((2, {"next_index": 2}), (4, b"\x00grain-state\xff"), (6, [1, "two"])):
            ck.save(step, state, data, {"step": step})
        ck.wait()
        assert ck.all_steps() == [4, 6]  # keep=2
    other = sharding.make_mesh((1, 8, 1))
    target = abstract_train_state(_state(other, P(None, "fsdp")))
    with Checkpointer(tmp_path / "ckpt", every_steps=2, keep=2) as ck:
        latest = ck.restore(target)
        older = ck.restore(target, step=4)
    assert latest.step == 6 and latest.data_state == [1, "two"] and latest.meta == {"step": 6}
    assert older.data_state == b"\x00grain-state\xff"
    w = latest.state["params"]["w"]
    assert w.sharding.spec == P(None, "fsdp")
    np.testing.assert_array_equal(np.asarray(w), np.arange(64.0).reshape(8, 8))
    np.testing.assert_array_equal(np.asarray(latest.state["rng"]), np.asarray(jax.random.PRNGKey(7)))


def test_unfinished_checkpoint_is_ignored_and_mismatch_is_named(tmp_path):
    mesh = sharding.make_mesh((1, 8, 1))
    state = _state(mesh, P(None, "fsdp"))
    with Checkpointer(tmp_path / "ckpt", every_steps=1, keep=3) as ck:
        ck.save(1, state, None)
    (tmp_path / "ckpt" / "2.orbax-checkpoint-tmp-123").mkdir()  # a save killed mid-write
    with Checkpointer(tmp_path / "ckpt", every_steps=1, keep=3) as ck:
        assert ck.latest_step() == 1
        wrong = abstract_train_state(state)
        wrong["params"]["w"] = jax.ShapeDtypeStruct((4, 4), jnp.float32, sharding=wrong["params"]["w"].sharding)
        with pytest.raises(ValueError, match=r"checkpoint .*/ckpt/1 does not match this run's train state .*"
                                             r"params/w: checkpoint \(8, 8\) float32, this run \(4, 4\) float32"):
            ck.restore(wrong)
    with pytest.raises(ValueError, match=r"config.train.checkpoint.keep = 0"):
        Checkpointer(tmp_path / "other", every_steps=1, keep=0)
