"""config.data.attempts = "first": SFT trains on the steps of attempts solved on attempt 1 only (what
a collector without retries would have kept), counted here from how the store was built; the sft
stage's split.json records the setting and a later stage reading the split under another one is
refused."""
import json

import pytest

from configs.common import base_config
from rmsweb_jax.collect.sft_view import SFTView
from rmsweb_jax.collect.store import StoreError, TrajectoryStore
from rmsweb_jax.collect.store_fixture import label_screenshot, retry_group
from rmsweb_jax.data.sft import SFTDataConfig, split_by_task
from rmsweb_jax.errors import UserError
from rmsweb_jax.stages.sft import saved_split, same_split_settings, split_path, split_record
from tests.settings import sft_data, store_writer

# (task, seed): retry_group arguments. Solving attempts take `steps` steps; a parse error is no target.
GROUPS = {
    ("t.a", 0): dict(solved_at=1, steps=3),
    ("t.a", 1): dict(solved_at=2, steps=2),
    ("t.b", 0): dict(solved_at=1, steps=4, parse_error_at=(1, 2)),
    ("t.b", 1): dict(solved_at=None, attempts=2),
    ("t.c", 0): dict(solved_at=3, steps=1),
    ("t.c", 1): dict(solved_at=1, steps=1),
    ("t.d", 0): dict(solved_at=1, steps=2),
}


def _targets(first_only: bool) -> set[tuple[str, int]]:
    """Returns the (request id, step) of every step that should be trained on, from GROUPS alone."""
    out = set()
    for (task, seed), kw in GROUPS.items():
        solved_at = kw["solved_at"]
        if solved_at is None or (first_only and solved_at != 1):
            continue
        bad = kw.get("parse_error_at")
        out |= {(f"{task}#{seed}@{solved_at}", i) for i in range(kw["steps"]) if bad != (solved_at, i)}
    return out


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    directory = tmp_path_factory.mktemp("first") / "store"
    with store_writer(directory, flush_every_tasks=3) as writer:
        for (task, seed), kw in GROUPS.items():
            writer.add_group(retry_group(task, seed, **kw))
    return directory


def _items(view):
    return [view[i] for i in range(len(view))]


def test_first_keeps_exactly_the_steps_of_attempt_1_successes(store):
    first, every = SFTView(store, attempts="first"), SFTView(store)
    assert {(ex.request_id, ex.step.step) for ex in _items(first)} == _targets(first_only=True)
    assert len(first) == len(_targets(first_only=True)) == 9
    assert {(ex.request_id, ex.step.step) for ex in _items(every)} == _targets(first_only=False)
    assert len(every) == 12
    # Its task groups are the groups solved on attempt 1, and nothing of a later attempt is in a history.
    assert sorted(first.task_keys) == [("t.a", 0), ("t.b", 0), ("t.c", 1), ("t.d", 0)]
    assert first.num_trajectories == 4 and every.num_trajectories == 6
    for ex in _items(first):
        assert ex.attempt == 1
        assert [p.screenshot for p in ex.history] == [label_screenshot(f"{ex.request_id}/{j}")
                                                      for j in range(ex.step.step)]
    # The store's own records agree (a second, independent count).
    with TrajectoryStore(store) as reader:
        trajectories = list(reader.trajectories())
        kept = [t for t in trajectories if t.success and t.attempt == 1]
        assert len(first) == sum(t.num_steps - t.parse_errors for t in kept)
    assert "attempts='first'" in repr(first)


def test_data_config_picks_the_view_and_rejects_other_values(store, tmp_path):
    config = base_config()
    config.data.store_dir = str(store)
    assert SFTDataConfig.from_config(config.data, tmp_path).view().attempts == "all"
    config.data.attempts = "first"
    data = SFTDataConfig.from_config(config.data, tmp_path)
    assert len(data.view()) == 9
    with pytest.raises(ValueError, match=r"config.data.attempts = 'last'; expected one of \['all', 'first'\]"):
        sft_data(store, attempts="last")
    with pytest.raises(ValueError, match="attempts='second'"):
        SFTView(store, attempts="second")


def test_a_store_solved_only_on_retries_has_nothing_first(tmp_path):
    directory = tmp_path / "store"
    with store_writer(directory) as writer:
        writer.add_group(retry_group("t.a", 0, solved_at=2))
    assert len(SFTView(directory)) == 2
    with pytest.raises(StoreError, match=r"1 more solved on a retry, left out by attempts='first'"):
        SFTView(directory, attempts="first")


def test_split_json_records_attempts_and_later_stages_keep_to_it(store, tmp_path):
    config = base_config()
    config.data.store_dir, config.data.attempts, config.data.held_out_fraction = str(store), "first", 0.25
    data = SFTDataConfig.from_config(config.data, tmp_path)
    view = data.view()
    split = split_by_task(view, data.held_out_fraction, data.split_seed)
    assert set(split.held_out_keys) <= set(view.task_keys) and len(split.held_out_keys) == 1
    path = split_path(tmp_path)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(split_record(data, view, split)))
    saved = json.loads(path.read_text())
    assert saved["attempts"] == "first"
    assert len(saved["train_task_groups"]) + len(saved["held_out_task_groups"]) == 4  # groups solved on attempt 1

    # mine / action_accuracy read the split back over the same view: the same examples on each side.
    _, again, back, _ = saved_split(config, tmp_path)
    assert again.attempts == "first" and list(back.train) == list(split.train)
    assert list(back.held_out) == list(split.held_out)
    assert same_split_settings(path, data)

    config.data.attempts = "all"
    assert not same_split_settings(path, SFTDataConfig.from_config(config.data, tmp_path))  # sft re-splits
    with pytest.raises(UserError, match="config.data.attempts is 'all', but .* split the store's 'first'"):
        saved_split(config, tmp_path)
