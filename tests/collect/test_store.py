"""Records and the trajectory store: round trips, schema errors, crash leftovers, Grain, SFTView."""
import os
import pickle
import subprocess
import sys
import textwrap

import grain
import grain.python as gp
import msgpack
import pytest

from rmsweb_jax.collect.records import SCHEMA_VERSION, SchemaError, StepRecord, TrajectoryRecord, decode_record
from rmsweb_jax.collect.sft_view import SFTView
from rmsweb_jax.collect.store import (STEPS, STORE_FILE, TMP_PREFIX, TRAJECTORIES, StoreError,
                                      TrajectoryStore, _write_shard, marker_name, shard_name)
from rmsweb_jax.web.action_text import parse_action
from rmsweb_jax.collect.store_fixture import retry_group as group
from tests.settings import COLLECT, sft_data, store_writer


def _strip_location(traj):
    import dataclasses
    return dataclasses.replace(traj, steps_shard="", steps_start=0)


def test_records_round_trip_bytes_stay_raw():
    (traj, steps), = group("t", 3, solved_at=1, attempts=1)
    for rec in (*steps, traj):
        data = rec.to_bytes()
        back = type(rec).from_bytes(data)
        assert back == rec
        assert decode_record(data) == rec
    raw = msgpack.unpackb(steps[0].to_bytes(), raw=False)
    assert raw["schema"] == SCHEMA_VERSION and raw["kind"] == "step"
    assert isinstance(raw["screenshot"], bytes) and raw["screenshot"].startswith(b"\x89PNG")
    # The stored target survived: the click at (312, 625) of a 160x120 page lands on Submit.
    assert steps[0].target.element.name == "Submit"
    assert parse_action(steps[0].text).action == steps[0].action.with_target(None)


def test_schema_version_and_kind_errors_name_what_was_found():
    (traj, steps), = group("t", 0, solved_at=1, attempts=1)
    d = msgpack.unpackb(steps[0].to_bytes(), raw=False)
    d["schema"] = SCHEMA_VERSION + 98
    with pytest.raises(SchemaError, match=rf"schema version {SCHEMA_VERSION + 98}.*reads version {SCHEMA_VERSION}"):
        StepRecord.from_bytes(msgpack.packb(d, use_bin_type=True))
    with pytest.raises(SchemaError, match="kind is 'trajectory'; expected 'step'"):
        StepRecord.from_bytes(traj.to_bytes())
    d = msgpack.unpackb(traj.to_bytes(), raw=False)
    del d["verdict"]
    with pytest.raises(SchemaError, match="verdict"):
        TrajectoryRecord.from_bytes(msgpack.packb(d, use_bin_type=True))
    with pytest.raises(SchemaError, match="not a store record"):
        decode_record(b"\x00\x01garbage")


def test_store_round_trip_flushes_and_reopen(tmp_path):
    groups = [group(f"task{i}", i % 2, solved_at=[1, 2, None, 3][i % 4]) for i in range(5)]
    with store_writer(tmp_path / "store", flush_every_tasks=2, flush_every_s=3600) as store:
        for g in groups:
            store.add_group(g)
        assert store.committed_flushes() == [1, 2] and store.buffered_tasks == 1
        assert len(store.finished_task_keys()) == 5
    reader = TrajectoryStore(tmp_path / "store")
    assert reader.committed_flushes() == [1, 2, 3]
    want = [traj for g in groups for traj, _ in g]
    got = list(reader.trajectories())
    assert [_strip_location(t) for t in got] == want
    steps_by_id = {traj.request_id: steps for g in groups for traj, steps in g}
    for traj in got:
        assert reader.steps(traj) == steps_by_id[traj.request_id]
    assert reader.counts() == {"tasks": 5, "trajectories": len(want), "successful_trajectories": 4,
                               "steps": sum(len(s) for s in steps_by_id.values()), "flushes": 3}
    assert reader.finished_task_keys() == {(f"task{i}", i % 2) for i in range(5)}
    # Reopening for writing continues the numbering and refuses a group already stored.
    with store_writer(tmp_path / "store", flush_every_tasks=1) as store:
        with pytest.raises(ValueError, match=r"already in the store"):
            store.add_group(groups[0])
        store.add_group(group("task9", 0, solved_at=1))
        assert store.committed_flushes() == [1, 2, 3, 4]


def test_group_checks_and_single_writer(tmp_path):
    with store_writer(tmp_path / "s") as store:
        g = group("a", 0, solved_at=2)
        with pytest.raises(ValueError, match="attempt 1 is numbered 2"):
            store.add_group(g[1:])
        with pytest.raises(StoreError, match="another process is writing"):
            store_writer(tmp_path / "s")
    store_writer(tmp_path / "s").close()  # the lock went with the first writer


def test_crash_leftovers_are_removed_on_open(tmp_path):
    root = tmp_path / "store"
    with store_writer(root, flush_every_tasks=1) as store:
        store.add_group(group("kept", 0, solved_at=1))
    # A flush that died between its steps shard and its trajectories shard, and one that died
    # while writing a temp file.
    orphan = group("lost", 0, solved_at=1)
    _write_shard(root / shard_name(STEPS, 2), (s.to_bytes() for _, steps in orphan for s in steps))
    (root / (TMP_PREFIX + shard_name(TRAJECTORIES, 2))).write_bytes(b"half a shard")
    reader = TrajectoryStore(root)
    assert reader.finished_task_keys() == {("kept", 0)}  # readers never see uncommitted flushes
    assert [p.name for p in reader.step_shards()] == [shard_name(STEPS, 1)]
    with store_writer(root) as store:
        assert store.removed_orphans == [TMP_PREFIX + shard_name(TRAJECTORIES, 2), shard_name(STEPS, 2)]
        store.add_group(orphan)
    assert sorted(os.listdir(root)) == sorted([".lock", STORE_FILE, shard_name(STEPS, 1), shard_name(TRAJECTORIES, 1),
                                               marker_name(1), shard_name(STEPS, 2), shard_name(TRAJECTORIES, 2),
                                               marker_name(2)])
    assert TrajectoryStore(root).finished_task_keys() == {("kept", 0), ("lost", 0)}


@pytest.mark.parametrize("dies_after", [STEPS, TRAJECTORIES])
def test_killed_writer_leaves_only_whole_flushes(tmp_path, dies_after):
    """A real SIGKILL in the middle of a flush: after its steps shard, or after both shards but
    before the commit marker."""
    root = tmp_path / "store"
    script = textwrap.dedent(f"""
        import os, signal
        from rmsweb_jax.collect import store as store_mod
        from rmsweb_jax.collect.store_fixture import retry_group as group
        w = store_mod.StoreWriter({str(root)!r}, flush_every_tasks=2, flush_every_s={COLLECT.flush_every_s!r})
        w.add_group(group("a", 0, solved_at=1)); w.add_group(group("b", 0, solved_at=2))
        real = store_mod._write_shard
        def dying(path, records):
            info = real(path, records)
            if path.name.startswith({dies_after!r} + "-000002"):
                os.kill(os.getpid(), signal.SIGKILL)
            return info
        store_mod._write_shard = dying
        w.add_group(group("c", 0, solved_at=None)); w.add_group(group("d", 0, solved_at=3))
    """)
    proc = subprocess.run([sys.executable, "-c", script], cwd=os.getcwd(), capture_output=True, timeout=120)
    assert proc.returncode == -9, proc.stderr.decode()[-2000:]
    written = [shard_name(STEPS, 2)] + ([shard_name(TRAJECTORIES, 2)] if dies_after == TRAJECTORIES else [])
    assert all((root / name).exists() for name in written) and not (root / marker_name(2)).exists()
    assert TrajectoryStore(root).committed_flushes() == [1]  # readers never see the unmarked flush
    with store_writer(root) as store:
        assert store.removed_orphans == sorted(written)
        assert store.finished_task_keys() == {("a", 0), ("b", 0)}
        store.add_group(group("c", 0, solved_at=None))
    assert TrajectoryStore(root).committed_flushes() == [1, 2]


def test_grain_reads_the_shards(tmp_path):
    groups = [group(f"g{i}", 0, solved_at=1 + i % 3) for i in range(4)]
    with store_writer(tmp_path, flush_every_tasks=3) as store:
        for g in groups:
            store.add_group(g)
    reader = TrajectoryStore(tmp_path)
    steps_src = gp.ArrayRecordDataSource([str(p) for p in reader.step_shards()])
    traj_src = gp.ArrayRecordDataSource([str(p) for p in reader.trajectory_shards()])
    all_steps = [s for g in groups for _, steps in g for s in steps]
    assert len(steps_src) == len(all_steps) and len(traj_src) == sum(len(g) for g in groups)
    ds = grain.MapDataset.source(steps_src).map(StepRecord.from_bytes)
    assert sorted((s.request_id, s.step) for s in ds) == sorted((s.request_id, s.step) for s in all_steps)
    assert {t.request_id for t in grain.MapDataset.source(traj_src).map(TrajectoryRecord.from_bytes)} == \
        {t.request_id for g in groups for t, _ in g}


def test_sft_view_successful_steps_only_without_reflections(tmp_path):
    groups = [group("solved1", 0, solved_at=1), group("solved3", 0, solved_at=3, parse_error_at=(3, 1), steps=3),
              group("never", 0, solved_at=None), group("solved2", 1, solved_at=2)]
    with store_writer(tmp_path, flush_every_tasks=2) as store:
        for g in groups:
            store.add_group(g)
    view = SFTView(tmp_path)
    winners = {t.request_id: steps for g in groups for t, steps in g if t.success}
    expected = [(rid, s.step) for rid, steps in winners.items() for s in steps if s.parse_error is None]
    assert len(view) == len(expected) == 2 + 2 + 2  # the bad turn of solved3@3 is no target
    assert view.num_trajectories == 3
    seen = []
    for i in range(len(view)):
        ex = view[i]
        seen.append((ex.request_id, ex.step.step))
        assert ex.request_id in winners
        want = winners[ex.request_id]
        assert ex.step == want[ex.step.step]
        assert ex.history == tuple(s.past_step() for s in want[:ex.step.step])
        assert ex.target_text == ex.step.text and ex.target_action_text.startswith("<tool_call>")
        ctx = ex.context()
        assert ctx.reflections == () and ctx.attempt == 1 and ctx.instruction == ex.instruction
        assert ctx.observation.screenshot == ex.step.screenshot
        # No field of the example carries a reflection, though the winning attempts had them.
        assert "reflection" not in repr(ex)
    assert sorted(seen) == sorted(expected)
    assert any(ex.attempt > 1 for ex in (view[i] for i in range(len(view))))
    clone = pickle.loads(pickle.dumps(view))
    assert len(clone) == len(view) and clone[len(view) - 1] == view[-1]
    batches = list(grain.MapDataset.source(view).map(lambda ex: ex.step.step).batch(4))
    assert sum(len(b) for b in batches) == len(view)


def test_sft_view_and_reader_errors_name_the_path(tmp_path):
    missing = tmp_path / "nowhere"
    with pytest.raises(StoreError, match=str(missing)):
        SFTView(missing)
    with pytest.raises(StoreError, match=str(missing)):
        TrajectoryStore(missing)
    store_writer(tmp_path / "empty").close()
    with pytest.raises(StoreError, match=rf"{tmp_path / 'empty'} holds no trajectories"):
        SFTView(tmp_path / "empty")
    with store_writer(tmp_path / "failed", flush_every_tasks=1) as store:
        store.add_group(group("x", 0, solved_at=None))
    with pytest.raises(StoreError, match="3 trajectories, 0 successful"):
        SFTView(tmp_path / "failed")
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / STORE_FILE).write_text('{"schema_version": 0}')
    with pytest.raises(StoreError, match=f"schema version 0; this code reads version {SCHEMA_VERSION}"):
        TrajectoryStore(tmp_path / "old")


def test_a_store_holds_one_policy_and_names_both_when_refusing_another(tmp_path):
    root = tmp_path / "store"
    with store_writer(root, flush_every_tasks=1, policy="flax:hf:/ckpt/step-100") as store:
        store.add_group(group("a", 0, solved_at=1))
    assert TrajectoryStore(root).policy == "flax:hf:/ckpt/step-100"
    with pytest.raises(StoreError, match=rf"{root}.*'flax:hf:/ckpt/step-100'.*'flax:hf:/ckpt/step-200'"):
        store_writer(root, policy="flax:hf:/ckpt/step-200")
    with store_writer(root, flush_every_tasks=1, policy="flax:hf:/ckpt/step-100") as store:  # the same policy appends
        store.add_group(group("b", 0, solved_at=1))
    assert TrajectoryStore(root).finished_task_keys() == {("a", 0), ("b", 0)}
    # A store created without a name takes the first writer's.
    store_writer(tmp_path / "unnamed").close()
    store_writer(tmp_path / "unnamed", policy="scripted-teacher").close()
    with pytest.raises(StoreError, match="'scripted-teacher'.*'http:qwen3-vl'"):
        store_writer(tmp_path / "unnamed", policy="http:qwen3-vl")


def test_provenance_is_recorded_at_creation_and_a_reader_with_other_settings_is_warned(tmp_path, caplog):
    import dataclasses

    from configs.common import base_config
    from rmsweb_jax.agents.prompt import prompt_config_from
    from rmsweb_jax.collect.store_fixture import task_group
    from rmsweb_jax.collect.store_provenance import check_provenance, provenance
    from rmsweb_jax.data.sft import EncodeSFTExample, SFTBatches
    from rmsweb_jax.processing.image import ImageProcessorConfig
    from rmsweb_jax.processing.prompt_tokens import load_tokenizer
    from rmsweb_jax.processing.tiny_tokenizer import build_tiny_tokenizer

    build_tiny_tokenizer(tmp_path / "tok")
    tokenizer = load_tokenizer(tmp_path / "tok")
    images = ImageProcessorConfig(min_pixels=8192, max_pixels=65536)
    shipped = prompt_config_from(base_config())
    produced = provenance(dataclasses.replace(shipped, history_steps=3, history_images=1), tokenizer, images)
    root = tmp_path / "store"
    with store_writer(root, flush_every_tasks=2, policy="flax:tiny", provenance=produced) as store:
        for t in range(2):
            store.add_group(task_group(f"t{t}", 0, fail_first=False, viewport=(200, 120), variant=t))
    assert TrajectoryStore(root).provenance == produced
    assert check_provenance(root, produced) == []
    assert check_provenance(root, provenance()) == []  # nothing known to compare: no warning
    assert not [r for r in caplog.records if "produced with other settings" in r.getMessage()]

    tokenizer.chat_template = tokenizer.chat_template.replace("<|im_start|>", "<|im_start|> ")
    other = provenance(dataclasses.replace(shipped, history_steps=4, history_images=1), tokenizer,
                       ImageProcessorConfig(min_pixels=8192, max_pixels=131072))
    assert check_provenance(root, other) == ["prompt.history_steps", "tokenizer", "image_processor"]
    (warning,) = [r for r in caplog.records if "produced with other settings" in r.getMessage()]
    assert str(root) in warning.getMessage() and "'prompt.history_steps': 3" in warning.getMessage()

    # The SFT pipeline compares where it rebuilds the prompts.
    caplog.clear()
    view = SFTView(root)
    rebuilt = dataclasses.replace(shipped, history_steps=2, history_images=1)
    data = sft_data(root)
    SFTBatches(view, range(len(view)), data, EncodeSFTExample(tmp_path / "tok", images, rebuilt, mask=data.mask),
               rows=2).close()
    (warning,) = [r for r in caplog.records if "produced with other settings" in r.getMessage()]
    assert "rebuilt with (prompt.history_steps):" in warning.getMessage()  # same tokenizer, same images
