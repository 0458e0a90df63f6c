"""action_accuracy reads the split sft wrote (<workdir>/sft/split.json) and never recomputes it:
task groups added to the store after sft land on neither side, and no training group is ever
held out. (No model here; test_sft_stage.py runs both stages end to end.)"""
import json

import pytest

from rmsweb_jax.collect.sft_view import SFTView
from rmsweb_jax.collect.store_fixture import task_group, write_synthetic_store
from rmsweb_jax.data.sft import SFTDataConfig, split_by_task
from rmsweb_jax.errors import UserError
from rmsweb_jax.stages.sft import saved_split, split_path, split_record
from tests.settings import store_writer

FRACTION = 0.25


def _config():
    from configs.common import base_config
    c = base_config()
    c.data.held_out_fraction = FRACTION
    return c


def _write_split(config, workdir):
    """Writes split.json as the sft stage does; returns the split."""
    data = SFTDataConfig.from_config(config.data, workdir)
    view = SFTView(data.store_dir)
    split = split_by_task(view, data.held_out_fraction, data.split_seed)
    split_path(workdir).parent.mkdir(parents=True)
    split_path(workdir).write_text(json.dumps(split_record(data, view, split)))
    return split


def test_groups_added_after_sft_change_nothing(tmp_path):
    write_synthetic_store(tmp_path / "store", tasks=4, seeds=2, viewport=(200, 120))
    config = _config()
    before = _write_split(config, tmp_path)
    saved = json.loads(split_path(tmp_path).read_text())
    train_keys = {tuple(k) for k in saved["train_task_groups"]}
    held_keys = {tuple(k) for k in saved["held_out_task_groups"]}
    assert len(held_keys) == 2 and len(train_keys) == 6 and not train_keys & held_keys

    # Collection goes on after sft: four more task groups.
    with store_writer(tmp_path / "store") as store:
        for t in range(4):
            store.add_group(task_group(f"synthetic.late-{t}", 0, fail_first=False, viewport=(200, 120), variant=t))
    grown = SFTView(tmp_path / "store")
    # Recomputing the split on the grown store would hold out a group sft trained on: the bug.
    assert set(split_by_task(grown, FRACTION, 0).held_out_keys) & train_keys

    _, view, split, path = saved_split(config, tmp_path)
    assert path == split_path(tmp_path) and set(split.held_out_keys) == held_keys
    assert {view.task_key(i) for i in split.held_out} == held_keys
    assert not {view.task_key(i) for i in split.held_out} & train_keys
    assert {view.task_key(i) for i in split.train} == train_keys
    assert len(split.held_out) == len(before.held_out) and len(split.train) == len(before.train)
    late = {k for k in grown.task_keys if k[0].startswith("synthetic.late-")}
    assert len(late) == 4 and not late & {view.task_key(i) for i in [*split.train, *split.held_out]}


def test_missing_split_or_another_store_is_named(tmp_path):
    write_synthetic_store(tmp_path / "store", tasks=4, seeds=2, viewport=(200, 120))
    config = _config()
    with pytest.raises(UserError, match=r"sft/split\.json: no split; the sft stage writes it"):
        saved_split(config, tmp_path)
    _write_split(config, tmp_path)
    write_synthetic_store(tmp_path / "other", tasks=4, seeds=2, viewport=(200, 120))
    config.data.store_dir = str(tmp_path / "other")
    with pytest.raises(UserError, match=r"config.data.store_dir resolves to .*other, but .*split\.json split the "
                                        r"store"):
        saved_split(config, tmp_path)


def test_a_rerun_of_sft_keeps_its_split_only_under_the_same_settings(tmp_path):
    # sft reuses split.json when store, fraction and seed match (a resume on a grown store must not
    # hold out groups the checkpoint trained on); other settings start a new split.
    from rmsweb_jax.stages.sft import same_split_settings
    write_synthetic_store(tmp_path / "store", tasks=4, seeds=2, viewport=(200, 120))
    config = _config()
    data = SFTDataConfig.from_config(config.data, tmp_path)
    assert not same_split_settings(split_path(tmp_path), data)
    _write_split(config, tmp_path)
    assert same_split_settings(split_path(tmp_path), data)
    config.data.split_seed = 1
    assert not same_split_settings(split_path(tmp_path), SFTDataConfig.from_config(config.data, tmp_path))
    config.data.split_seed, config.data.held_out_fraction = 0, 0.5
    assert not same_split_settings(split_path(tmp_path), SFTDataConfig.from_config(config.data, tmp_path))
