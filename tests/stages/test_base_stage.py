"""The base stage (rmsweb_jax/stages/base.py) on a few synthetic pages: it trains from random:base, probes held-out
pages during and after training (probe.jsonl, the summary), exports, resumes, and refuses seeds that could meet the
demo's."""
import json

import pytest

from configs.base import get_config
from rmsweb_jax.errors import UserError
from rmsweb_jax.stages import base


def _config(**base_fields):
    c = get_config("pilot")
    c.mesh.shape = (1, 1, 1)
    c.base.pages, c.base.max_elements, c.base.probe_rows, c.base.probe_every = 12, 6, 4, 1
    c.base.probe_batch_size, c.base.probe_max_new_tokens = 4, 24
    c.train.optimizer.total_steps, c.train.optimizer.warmup_steps, c.train.batch_size = 2, 1, 4
    c.train.metrics.every_steps = 1
    for key, value in base_fields.items():
        c.base[key] = value
    return c


@pytest.mark.slow
def test_the_base_trains_on_synthetic_pages_probes_held_out_ones_and_resumes(tmp_path):
    summary = base.run(_config(), tmp_path)
    assert summary["steps"] == 2 and summary["rows"] > 12 and (tmp_path / "base" / "hf" / "config.json").is_file()
    probe = summary["held_out_probe"]
    assert probe["rows"] == 4 and 0 <= probe["exact"] <= probe["correct"] <= 4 and probe["step"] == 2
    curve = [json.loads(line) for line in (tmp_path / "base" / "probe.jsonl").read_text().splitlines()]
    assert [p["step"] for p in curve] == [1, 2]  # every probe_every steps, and after training
    assert summary["first_loss"] > 0 and summary["held_out_seed"] != summary["seed"] >= base.FIRST_SEED

    again = base.run(_config(), tmp_path)  # the same command: resumes at its last checkpoint, probes it again
    assert again["resumed_from"] == 2 and again["steps"] == 2
    assert [json.loads(line)["step"] for line in (tmp_path / "base" / "probe.jsonl").read_text().splitlines()] == \
        [1, 2, 2]


@pytest.mark.parametrize("fields, wants", [
    ({"seed": 1000}, "expected two different seeds >= 1,000,000"),
    ({"held_out_seed": 1_000_000}, "expected two different seeds"),
    ({"min_elements": 9, "max_elements": 6}, "1 <= min_elements <= max_elements"),
    ({"probe_every": -1}, "probe_every = -1"),
])
def test_settings_that_cannot_work_are_refused_naming_them(tmp_path, fields, wants):
    with pytest.raises(UserError, match=wants):
        base.check_config(_config(**fields), tmp_path)
