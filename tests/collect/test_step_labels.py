"""StepRecord.label: the ScriptedTeacher's injected mistakes reach the store step for step (real
Chromium on MiniWoB++), labels round-trip, and a store of the label-less schema is refused with
the way out. (The teacher is a scripted stand-in for an LLM collector; its rates are no result.)"""
import dataclasses
import json

import msgpack
import pytest

from rmsweb_jax.agents.teacher import MISTAKE_KINDS, MistakeConfig, ScriptedTeacher
from rmsweb_jax.collect.records import SCHEMA_VERSION, SchemaError, StepRecord
from rmsweb_jax.collect.retries import RetryCollector
from rmsweb_jax.collect.store import StoreError, TrajectoryStore
from rmsweb_jax.collect.store_fixture import click_step, write_synthetic_store
from rmsweb_jax.collect.store_layout import STORE_FILE
from rmsweb_jax.judges.programmatic import ProgrammaticJudge
from rmsweb_jax.suites.miniwob import MiniWoBSuite, load_miniwob_tasks
from tests.settings import collect_settings, store_writer

TASKS = ("miniwob.click-button", "miniwob.click-checkboxes", "miniwob.click-link", "miniwob.click-option",
         "miniwob.enter-text", "miniwob.login-user")
SEEDS = (0, 1, 2)
MISTAKES = MistakeConfig(wrong_element_p=0.2, detour_p=0.25, early_stop_p=0.1, seed=3)


def test_labels_round_trip_and_default_to_none():
    step = click_step("t", 0, 1, 0)
    assert step.label is None and StepRecord.from_bytes(step.to_bytes()) == step
    for kind in MISTAKE_KINDS:
        labelled = dataclasses.replace(step, label=kind)
        assert StepRecord.from_bytes(labelled.to_bytes()) == labelled


def test_records_and_stores_of_the_label_less_schema_are_refused(tmp_path):
    old = msgpack.unpackb(click_step("t", 0, 1, 0).to_bytes(), raw=False)
    old.pop("label")
    old["schema"] = 1
    with pytest.raises(SchemaError, match=f"schema version 1; this code reads version {SCHEMA_VERSION}"):
        StepRecord.from_bytes(msgpack.packb(old, use_bin_type=True))
    store = write_synthetic_store(tmp_path / "store", tasks=1, seeds=1)
    meta = json.loads((store / STORE_FILE).read_text())
    (store / STORE_FILE).write_text(json.dumps({**meta, "schema_version": 1}))
    with pytest.raises(StoreError, match=r"schema version 1; this code reads version 2 .*collect into a new store"):
        TrajectoryStore(store)


@pytest.mark.browser
def test_teacher_mistakes_are_stored_as_step_labels(tmp_path):
    known = {t.id: t for t in load_miniwob_tasks()}
    teacher = ScriptedTeacher(MISTAKES, tasks=TASKS)
    with MiniWoBSuite() as suite, store_writer(tmp_path / "store", policy=teacher.name) as store:
        # attempts=1: no reflection, so the teacher remembers every attempt's mistakes.
        RetryCollector(suite, teacher, ProgrammaticJudge(success="solved"), store,
                       collect_settings(attempts=1, workers=2,
                       max_steps=10, progress=False)).run([known[t] for t in TASKS], SEEDS)
    reader = TrajectoryStore(tmp_path / "store")
    seen = {kind: 0 for kind in MISTAKE_KINDS}
    trajectories = list(reader.trajectories())
    assert len(trajectories) == len(TASKS) * len(SEEDS)
    for traj in trajectories:
        injected = {m.step: m.kind for m in teacher.injected(traj.request_id)}
        labels = {s.step: s.label for s in reader.steps(traj) if s.label is not None}
        assert labels == injected, traj.request_id
        for kind in labels.values():
            seen[kind] += 1
    assert all(seen.values()), seen  # every kind was injected, so every kind was checked
    assert sum(seen.values()) == teacher.stats()["mistakes_injected"]
