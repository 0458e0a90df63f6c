"""The logged loss is a window's mean and says so, on the console and in the end-of-stage summary
(train/metrics.py loss_summary); the files are the writer's own (MetricsWriter), read back."""
import json

from rmsweb_jax.train.metrics import WINDOW, MetricsWriter, loss_summary, read_metrics


def test_the_console_line_and_the_summary_name_the_windows_their_losses_are_the_means_of(tmp_path, capsys):
    writer = MetricsWriter(tmp_path / "sft", progress=False)
    for step, loss in ((10, 5.2551), (20, 4.5), (25, 3.1)):  # every 10 steps, then the last 5
        writer.write(step, {"loss": loss, "grad_norm": 1.0})
    writer.close()
    resumed = MetricsWriter(tmp_path / "sft", progress=False, initial_step=20)  # a resume from step 20
    resumed.write(25, {"loss": 3.1, "grad_norm": 1.0})
    resumed.close()
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "[train] step 10: loss (mean of steps 1-10) 5.255  grad_norm 1"
    assert lines[2].startswith("[train] step 25: loss (mean of steps 21-25) 3.1  ") and lines[3] == lines[2]
    summary = loss_summary(tmp_path / "sft" / "metrics.jsonl")
    assert summary["text"] == ("loss 5.255 (mean of steps 1-10, the first of 3 logged windows) -> 3.100 "
                               "(mean of steps 21-25, the last)")
    assert (summary["windows"], summary["first_steps"], summary["last_steps"]) == (3, [1, 10], [21, 25])
    assert {s: m[WINDOW] for s, m in read_metrics(tmp_path / "sft" / "metrics.jsonl").items()} == {10: 10, 20: 10,
                                                                                                 25: 5}


def test_one_logged_window_is_said_to_show_no_trend_and_older_records_are_read_by_their_steps(tmp_path):
    writer = MetricsWriter(tmp_path / "one", progress=False)
    writer.write(2, {"loss": 5.2551})
    writer.close()
    assert loss_summary(tmp_path / "one" / "metrics.jsonl")["text"] == (
        "loss 5.255 (mean of steps 1-2, the only logged window: no trend)")
    # metrics.jsonl written before the trainer recorded its windows: each starts after the record before it
    (tmp_path / "old.jsonl").write_text("".join(json.dumps(r) + "\n" for r in (
        {"step": 50, "loss": 6.0}, {"step": 100, "loss": 4.0}, {"step": 101, "loss": 3.9})))
    old = loss_summary(tmp_path / "old.jsonl")
    assert old["text"] == "loss 6.000 (mean of steps 1-50, the first of 3 logged windows) -> 3.900 (step 101, the last)"
    assert loss_summary(tmp_path / "absent.jsonl")["text"] == "no loss logged"
