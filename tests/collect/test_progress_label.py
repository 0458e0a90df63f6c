"""The retry loop's progress bar says which stage plays (CollectSettings.progress_label): collect's from the config,
eval's and mine's rollouts' as they replace it. No browser: the bar opens before the browser pool starts."""
import types

import pytest

from rmsweb_jax.agents.teacher import MistakeConfig, ScriptedTeacher
from rmsweb_jax.collect import retries
from rmsweb_jax.collect.retries import RetryCollector
from tests.settings import COLLECT, collect_settings, store_writer


class BarOpened(Exception):
    """Raised by the recording bar, so that the loop stops before any browser starts."""


@pytest.mark.parametrize("label", [None, "eval"], ids=["from the config", "replaced"])
def test_the_progress_bar_is_named_by_the_settings(tmp_path, monkeypatch, label):
    names = []

    def recording_bar(*args, desc, **kwargs):
        names.append(desc)
        raise BarOpened

    monkeypatch.setattr(retries, "tqdm", recording_bar)
    settings = collect_settings() if label is None else collect_settings(progress_label=label)
    task = types.SimpleNamespace(id="miniwob.click-button")
    policy = ScriptedTeacher(MistakeConfig.from_dict(COLLECT.teacher.to_dict()), tasks=[task.id])
    with store_writer(tmp_path / "store") as store:
        collector = RetryCollector(None, policy, None, store, settings)
        with pytest.raises(BarOpened):
            collector.run([task], [0])
    assert names == [label or "collect"]
