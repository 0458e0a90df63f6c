"""The RL state set: CriticalState validation and msgpack round trip, the ArrayRecord file written
atomically, and StateSet.example rebuilding exactly the SFTView example from a real store."""
import dataclasses
import os

import msgpack
import pytest

from rmsweb_jax.collect.sft_view import SFTView
from rmsweb_jax.collect.store import StoreError
from rmsweb_jax.collect.store_fixture import write_synthetic_store
from rmsweb_jax.data.sft import example_name
from rmsweb_jax.mining.state_set import (
    STATE_SCHEMA_VERSION, CriticalState, StateSet, StateSetError, state_id, write_state_set)
from rmsweb_jax.web.actions import Action


@pytest.fixture(scope="module")
def view(tmp_path_factory):
    return SFTView(write_synthetic_store(tmp_path_factory.mktemp("store") / "store", tasks=3, seeds=2))


def _state(example, *, store_dir, source="replay", failure_mode="wrong_element", **kw) -> CriticalState:
    fields = dict(state_id=state_id(source, example.request_id, example.step.step), task_id=example.task_id,
                  seed=example.seed, attempt=example.attempt, step=example.step.step, request_id=example.request_id,
                  store_dir=str(store_dir), reference_text=example.target_text,
                  reference_action=example.step.action, failure_mode=failure_mode,
                  critical=failure_mode != "routine", replay_accuracy=0.25, reference_logprob=-3.5, source=source,
                  prefix_matched=None if source == "replay" else True, teacher_label=None)
    fields.update(kw)
    return CriticalState(**fields)


def test_round_trip_and_examples_equal_the_sft_view(view, tmp_path):
    states = [_state(view[i], store_dir=view.store_dir, failure_mode=("routine" if i % 3 == 0 else "wrong_text"))
              for i in range(len(view))]
    states.append(_state(view[4], store_dir=view.store_dir, source="rollout", replay_accuracy=None,
                         reference_logprob=None, prefix_matched=False, teacher_label="detour"))
    path = write_state_set(tmp_path / "mine" / "states.arrayrecord", states)
    assert sorted(os.listdir(path.parent)) == ["states.arrayrecord"]  # no temp file left
    with StateSet(path) as loaded:
        assert len(loaded) == len(states) and list(loaded) == states
        assert loaded[4].reference_action == view[4].step.action and loaded[4].reference_action.target is not None
        for i in range(len(view)):
            assert loaded.example(i) == view[i], example_name(view[i])  # history, step record, everything
        assert loaded.example(len(view)) == view[4]
        assert f"{len(states)} states, {sum(s.critical for s in states)} critical" in repr(loaded)


def test_the_dict_and_bytes_forms_round_trip(view):
    state = _state(view[1], store_dir=view.store_dir)
    assert CriticalState.from_dict(state.to_dict()) == state
    assert CriticalState.from_bytes(state.to_bytes()) == state
    assert CriticalState(**{**state.to_dict()}) == state  # the stored action dict is accepted too
    record = msgpack.unpackb(state.to_bytes())
    assert record["schema"] == STATE_SCHEMA_VERSION and record["kind"] == "critical_state"


@pytest.mark.parametrize("change,message", [
    (dict(failure_mode="bad_luck"), "failure_mode must be one of"),
    (dict(critical=False), "critical=False contradicts failure_mode 'wrong_element'"),
    (dict(failure_mode="routine"), "critical=True contradicts failure_mode 'routine'"),
    (dict(replay_accuracy=1.5), "replay_accuracy must be None or a number in \\[0, 1\\]"),
    (dict(reference_logprob=float("nan")), "reference_logprob must be None or a finite number <= 0"),
    (dict(source="dream"), "source must be one of"),
    (dict(prefix_matched=True), "prefix_matched is for rollout states"),
    (dict(step=-1), "step must be an int >= 0"),
    (dict(attempt=0), "attempt must be an int >= 1"),
    (dict(request_id=""), "request_id must be a non-empty string"),
    (dict(teacher_label=""), "teacher_label must be None or a non-empty string"),
])
def test_bad_fields_are_named(view, change, message):
    with pytest.raises(ValueError, match=message):
        dataclasses.replace(_state(view[0], store_dir=view.store_dir), **change)


def test_a_rollout_state_needs_prefix_matched(view):
    with pytest.raises(ValueError, match="a rollout state needs prefix_matched"):
        _state(view[0], store_dir=view.store_dir, source="rollout", prefix_matched=None)


def test_duplicate_ids_and_bad_files_are_refused(view, tmp_path):
    state = _state(view[0], store_dir=view.store_dir)
    with pytest.raises(ValueError, match="states 0 and 1 share state_id"):
        write_state_set(tmp_path / "dup.arrayrecord", [state, state])
    assert not (tmp_path / "dup.arrayrecord").exists()
    with pytest.raises(StateSetError, match="no state set at"):
        StateSet(tmp_path / "missing.arrayrecord")
    (tmp_path / "junk.arrayrecord").write_bytes(b"not an array record file")
    with pytest.raises(StateSetError, match="junk.arrayrecord"):
        StateSet(tmp_path / "junk.arrayrecord")

    # A record of another schema version: the file and the record are named.
    path = write_state_set(tmp_path / "old.arrayrecord", [state])
    from array_record.python.array_record_module import ArrayRecordWriter
    writer = ArrayRecordWriter(str(path), "group_size:1")
    writer.write(state.to_bytes())
    writer.write(msgpack.packb({**msgpack.unpackb(state.to_bytes()), "schema": 99}))
    writer.close()
    with pytest.raises(StateSetError, match=r"old.arrayrecord record 1: state record has schema version 99"):
        StateSet(path)


def test_example_names_the_state_and_store_at_fault(view, tmp_path):
    gone = _state(view[0], store_dir=tmp_path / "nowhere")
    other = dataclasses.replace(_state(view[0], store_dir=view.store_dir), request_id="synthetic.form-9#0@1",
                                state_id="replay:synthetic.form-9#0@1/0")
    long = dataclasses.replace(_state(view[0], store_dir=view.store_dir), step=7, state_id="replay:x/7")
    with StateSet(write_state_set(tmp_path / "s.arrayrecord", [gone, other, long])) as states:
        with pytest.raises(StoreError, match=r"s.arrayrecord record 0 \(replay:.*\): .*nowhere"):
            states.example(0)
        with pytest.raises(StoreError, match=r"record 1 .* holds no attempt 'synthetic.form-9#0@1'"):
            states.example(1)
        with pytest.raises(StoreError, match=r"record 2 .* has 3 steps; the state is step 7"):
            states.example(2)
