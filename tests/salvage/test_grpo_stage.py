"""config.salvage.algorithm = "grpo" through the salvage stage: plain GRPO trains on what Salvage-DS's gates
reject and builds no anchor rows (the same tiny setup as test_salvage_stage.py, where nothing is right)."""
import json

import pytest

from rmsweb_jax.main import run_stages
from rmsweb_jax.train.metrics import read_metrics
from tests.salvage.test_salvage_stage import _config, write_states

STEPS = 2


@pytest.mark.slow
def test_grpo_accepts_the_first_group_and_anchors_nothing(tmp_path):
    n_states = write_states(tmp_path)
    config = _config()
    config.salvage.algorithm = "grpo"
    config.salvage.train.total_steps = STEPS
    run_stages(config, tmp_path)
    summary = json.loads((tmp_path / "salvage" / "summary.json").read_text())
    assert summary["algorithm"] == "grpo" and summary["steps"] == STEPS and summary["states"] == n_states
    metrics = read_metrics(tmp_path / "salvage" / "metrics.jsonl")
    assert sorted(metrics) == [1, 2]
    for m in metrics.values():
        # Salvage-DS (test_salvage_stage.py) draws both states, accepts none and anchors both. GRPO's gate
        # accepts the first group drawn, all wrong as it is (zero advantages), and nothing is anchored.
        assert (m["groups_accepted"], m["states_drawn"], m["shortfall"], m["groups_anchored"]) == (1, 1, 0, 0)
        assert m["correct_share"] == 0.0 and m["reward_mean"] == 0.0  # the binary reward, not -1
        assert m["rows_anchor_rows"] == 0 and m["rows_policy_rows"] == 2
    assert summary["sampler_state"]["drawn"] == STEPS
