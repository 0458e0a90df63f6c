"""The mining report: counts by failure mode, source and task, the teacher-noise share, and its three files."""
import json

from PIL import Image

from rmsweb_jax.collect.sft_view import SFTView
from rmsweb_jax.collect.store_fixture import write_synthetic_store
from rmsweb_jax.mining.report import compute_report, write_report
from tests.mining.test_state_set import _state


def test_report_counts_and_files(tmp_path):
    view = SFTView(write_synthetic_store(tmp_path / "store", tasks=2, seeds=1))
    ex = [view[i] for i in range(len(view))]  # 2 groups x 3 steps
    states = [
        _state(ex[0], store_dir=view.store_dir, failure_mode="wrong_text", replay_accuracy=0.0, reference_logprob=-9.0),
        _state(ex[1], store_dir=view.store_dir, failure_mode="wrong_element", teacher_label="wrong_element",
               replay_accuracy=0.25, reference_logprob=-7.0),
        _state(ex[2], store_dir=view.store_dir, failure_mode="routine", replay_accuracy=1.0, reference_logprob=-1.0),
        _state(ex[3], store_dir=view.store_dir, failure_mode="wrong_element", replay_accuracy=0.0,
               reference_logprob=-5.0),
        _state(ex[4], store_dir=view.store_dir, failure_mode="routine", replay_accuracy=0.75, reference_logprob=-3.0),
        _state(ex[4], store_dir=view.store_dir, source="rollout", failure_mode="repetition_loop", replay_accuracy=None,
               reference_logprob=None, prefix_matched=True),
    ]
    state_set = {"path": "s", "states": 3, "critical": 2, "routine": 1, "by_task": {"synthetic.form-1": 3}}
    report = compute_report(states, tau=0.5, extra={"skipped": {"detour": 1}, "state_set": state_set})
    assert (report["states"], report["critical"], report["routine"]) == (6, 4, 2)
    assert report["failure_modes"] == {"invalid_format": 0, "wrong_action_type": 0, "wrong_element": 2,
                                       "wrong_text": 1, "premature_stop": 0, "wrong_answer": 0,
                                       "repetition_loop": 1, "out_of_steps": 0}
    assert report["by_source"] == {"replay": {"states": 5, "critical": 3}, "rollout": {"states": 1, "critical": 1}}
    assert report["teacher_noise"] == {"critical_with_label": 1, "share_of_critical": 0.25,
                                       "by_label": {"wrong_element": 1}}
    assert report["mean_reference_logprob"] == {"critical": -7.0, "routine": -2.0}
    assert report["mean_replay_accuracy"] == 0.4
    assert report["by_task"] == {
        "synthetic.form-0": {"states": 3, "critical": 2, "critical_share": 2 / 3, "mean_replay_accuracy": 1.25 / 3,
                             "top_failure_mode": "wrong_text"},
        "synthetic.form-1": {"states": 3, "critical": 2, "critical_share": 2 / 3, "mean_replay_accuracy": 0.375,
                             "top_failure_mode": "wrong_element"}}
    assert report["skipped"] == {"detour": 1}

    paths = write_report(tmp_path / "mine", report)
    assert json.loads(paths["json"].read_text()) == report
    markdown = paths["markdown"].read_text()
    assert "4 critical" in markdown and "| wrong_element | 2 |" in markdown and "| synthetic.form-1 | 3 | 2 | 66.7% | 3 |" in markdown
    assert "| synthetic.form-0 | 3 | 2 | 66.7% | — |" in markdown
    assert "1 (25.0% of critical; {'wrong_element': 1})" in markdown
    image = Image.open(paths["plot"])
    assert image.format == "PNG" and image.size == (720, 360)
    # The wrong_element bar (the largest) reaches further right than the wrong_text one.
    red = [[x for x in range(image.width) if image.getpixel((x, y)) == (200, 80, 60)] for y in range(image.height)]
    widths = [max(r) if r else 0 for r in red]
    assert max(widths) > 600 and sorted(set(widths))[1] < 400
