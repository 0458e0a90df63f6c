"""A damaged newest checkpoint: truncated or flipped afterwards, it is quarantined with one line and the run resumes
from the newest intact one with the uninterrupted run's losses; with none intact the run stops (UserError).

The killed run steps a Trainer by hand to step 18 (checkpoints 6, 12, 18) and stops without finishing, as a
SIGKILL would leave it (tests/train/test_loop.py kills a real subprocess; here the damage is the subject).
"""
import shutil

import numpy as np
import pytest

from rmsweb_jax.errors import UserError
from rmsweb_jax.train import SyntheticBatches, Trainer, random_examples
from rmsweb_jax.train.checkpoint import Checkpointer, CheckpointDamaged
from rmsweb_jax.train.metrics import read_metrics

from configs.common import base_config

STEPS, EVERY, KILLED_AT = 24, 6, 18
OVERRIDES = {"batch_size": 8, "optimizer.lr": 1e-2, "optimizer.warmup_steps": 3, "optimizer.total_steps": STEPS,
             "checkpoint.every_steps": EVERY, "checkpoint.keep": 3, "metrics.every_steps": 1}


def _config(init):
    c = base_config()
    c.model.init = f"hf:{init}"
    c.mesh.shape = (1, 1, 1)
    for key, value in OVERRIDES.items():
        *path, last = key.split(".")
        node = c.train
        for p in path:
            node = node[p]
        node[last] = value
    return c


def _source(trainer):
    return SyntheticBatches(random_examples(trainer.model_config, count=8, seq_len=32, seed=0), batch_size=8)


@pytest.fixture(scope="module")
def reference(tmp_path_factory, tiny_checkpoint):
    """Returns {step: metrics} of the uninterrupted run."""
    workdir = tmp_path_factory.mktemp("uninterrupted")
    trainer = Trainer(_config(tiny_checkpoint), workdir, name="sft")
    trainer.fit(_source(trainer))
    return read_metrics(workdir / "sft" / "metrics.jsonl")


@pytest.fixture(scope="module")
def killed(tmp_path_factory, tiny_checkpoint):
    """Returns the workdir of a run stopped after step 18 (checkpoints 6, 12 and 18 on disk)."""
    workdir = tmp_path_factory.mktemp("killed")
    trainer = Trainer(_config(tiny_checkpoint), workdir, name="sft")
    iterator = iter(_source(trainer))
    for _ in range(KILLED_AT):
        trainer.step(next(iterator), iterator.get_state())
    trainer.close()
    assert trainer.checkpoints.all_steps() == [6, 12, 18]
    return workdir


def _largest_array_file(step_dir):
    return max((p for p in (step_dir / "state").rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)


def _truncate(step_dir):
    path = _largest_array_file(step_dir)
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _flip(step_dir):
    path = _largest_array_file(step_dir)
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle:middle + 8] = bytes(b ^ 0xFF for b in data[middle:middle + 8])
    path.write_bytes(bytes(data))


@pytest.mark.slow  # ~20 s each, plus ~40 s for the uninterrupted and killed runs they share (2 cores)
@pytest.mark.parametrize("damage", [_truncate, _flip], ids=["truncated", "flipped"])
def test_a_damaged_newest_checkpoint_is_quarantined_and_the_run_resumes_from_the_previous_one(
        damage, killed, reference, tiny_checkpoint, tmp_path, capsys):
    workdir = tmp_path / "run"
    shutil.copytree(killed, workdir)
    checkpoints = workdir / "sft" / "checkpoints"
    damage(checkpoints / str(KILLED_AT))
    trainer = Trainer(_config(tiny_checkpoint), workdir, name="sft")
    assert trainer.resumed_from == KILLED_AT - EVERY
    lines = [line for line in capsys.readouterr().out.splitlines() if "is damaged, moved to" in line]
    assert len(lines) == 1 and lines[0].startswith(f"[train] checkpoint step {KILLED_AT} is damaged, moved to "
                                                   f"{checkpoints / 'quarantine' / str(KILLED_AT)}-"), lines
    assert ("does not read back: " if damage is _truncate else "arrays differ from their fingerprint") in lines[0]
    (moved,) = (checkpoints / "quarantine").iterdir()
    assert (moved / "state").is_dir() and not (checkpoints / str(KILLED_AT)).exists()
    trainer.fit(_source(trainer))
    got = read_metrics(workdir / "sft" / "metrics.jsonl")
    for step in range(KILLED_AT - EVERY + 1, STEPS + 1):
        assert abs(got[step]["loss"] - reference[step]["loss"]) <= 1e-6, (step, got[step], reference[step])


def test_with_no_intact_checkpoint_the_run_stops_and_says_where_they_went(killed, tiny_checkpoint, tmp_path, capsys):
    workdir = tmp_path / "run"
    shutil.copytree(killed, workdir)
    checkpoints = workdir / "sft" / "checkpoints"
    for step, damage in ((6, _flip), (12, _truncate), (18, _truncate)):
        damage(checkpoints / str(step))
    message = (f"no intact checkpoint in {checkpoints}: the damaged ones are in {checkpoints / 'quarantine'} "
               r"\(6-.*, 12-.*, 18-.*\); to train this stage from step 0 instead, move .* away and rerun")
    with pytest.raises(UserError, match=message):
        Trainer(_config(tiny_checkpoint), workdir, name="sft")
    assert len([line for line in capsys.readouterr().out.splitlines() if "is damaged, moved to" in line]) == 3
    with pytest.raises(UserError, match=message):  # and the next run too: never a silent start from step 0
        Trainer(_config(tiny_checkpoint), workdir, name="sft")


def test_a_garbled_metadata_file_is_damage_and_a_changed_shape_is_not(tmp_path):
    import jax.numpy as jnp
    from rmsweb_jax.train.step import abstract_train_state
    state = {"w": jnp.arange(64.0).reshape(8, 8), "step": jnp.int32(3)}
    with Checkpointer(tmp_path, every_steps=1, keep=3) as ck:
        ck.save(1, state, {"i": 1}, {"s": 1})
        ck.save(2, state, {"i": 2}, {"s": 2})
    (tmp_path / "2" / "state" / "_METADATA").write_text("{garbled")
    with Checkpointer(tmp_path, every_steps=1, keep=3) as ck:
        with pytest.raises(CheckpointDamaged, match="2: its metadata does not read"):
            ck.restore(abstract_train_state(state), 2)
        other = abstract_train_state({"w": jnp.zeros((4, 16)), "step": jnp.int32(0)})
        with pytest.raises(ValueError, match="does not match this run's train state") as info:
            ck.restore(other, 1)
        assert not isinstance(info.value, CheckpointDamaged)
        restored = ck.restore(abstract_train_state(state), 1)
        np.testing.assert_array_equal(np.asarray(restored.state["w"]), np.arange(64.0).reshape(8, 8))
        assert restored.meta == {"s": 1}


def _flipped(data: bytes) -> bytes:
    middle = len(data) // 2
    return data[:middle] + bytes(b ^ 0xFF for b in data[middle:middle + 8]) + data[middle + 8:]


@pytest.mark.slow
@pytest.mark.parametrize("damage", ["truncated", "flipped"])
def test_on_a_bucket_a_damaged_newest_checkpoint_is_quarantined_and_the_run_resumes(
        damage, gcs_emulator, killed, reference, tiny_checkpoint, tmp_path, capsys):
    from rmsweb_jax import storage
    workdir = storage.as_path(f"{gcs_emulator}/damaged-{tmp_path.name}")
    for path in sorted(p for p in killed.rglob("*") if p.is_file()):  # the killed run, as if it had run there
        storage.upload(path, workdir / str(path.relative_to(killed)))
    checkpoints = workdir / "sft" / "checkpoints"
    victim = max((p for p in (killed / "sft" / "checkpoints" / str(KILLED_AT) / "state").rglob("*") if p.is_file()),
                 key=lambda p: p.stat().st_size).relative_to(killed)
    # an object cut short, or with bytes flipped, after the checkpoint's commit marker
    (workdir / str(victim)).write_bytes(b"" if damage == "truncated" else _flipped((killed / victim).read_bytes()))
    trainer = Trainer(_config(tiny_checkpoint), workdir, name="sft")
    assert trainer.resumed_from == KILLED_AT - EVERY
    lines = [line for line in capsys.readouterr().out.splitlines() if "is damaged, moved to" in line]
    assert len(lines) == 1 and f"{checkpoints}/quarantine/{KILLED_AT}-" in lines[0], lines
    assert ("does not read back: " if damage == "truncated" else "arrays differ from their fingerprint") in lines[0]
    assert not (checkpoints / str(KILLED_AT)).exists()
    trainer.fit(_source(trainer))
    got = read_metrics(workdir / "sft" / "metrics.jsonl")
    for step in range(KILLED_AT - EVERY + 1, STEPS + 1):
        assert abs(got[step]["loss"] - reference[step]["loss"]) <= 1e-6, (step, got[step], reference[step])
