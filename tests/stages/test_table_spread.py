"""table_spread: the table's figures over several runs, each recomputed here from the runs' demo_table.json."""
import json
import statistics

import pytest

from rmsweb_jax.errors import UserError
from rmsweb_jax.stages import table, table_spread


def _table(plain1, refl_k, sft, rmsweb, steps, critical_share, accepted):
    rows = [{"key": "sft", "row": table.ROWS["sft"], "success": sft, "mean_steps_all_solved": steps,
             "vs_baseline": None},
            {"key": "rmsweb", "row": table.ROWS["rmsweb"], "success": rmsweb, "mean_steps_all_solved": steps - 0.5,
             "vs_baseline": {"difference": rmsweb - sft, "ci95": [rmsweb - sft - 0.05, rmsweb - sft + 0.05]}}]
    return {"collection": {"plain": {"success_at_1": plain1, "success_at_le_K": plain1 + 0.1, "mean_steps_solved": 2.5},
                           "reflection": {"success_at_1": plain1, "success_at_le_K": refl_k,
                                          "mean_steps_solved": None}},
            "policies": {"rows": rows}, "mining": {"critical_share": critical_share},
            "salvage": {"accepted_share": accepted, "anchored_share": 1 - accepted}}


def test_each_figure_per_run_with_its_mean_range_and_sd(tmp_path, capsys):
    runs = [_table(0.6, 0.9, 0.30, 0.33, 2.0, 0.8, 0.5), _table(0.7, 0.95, 0.26, 0.31, 3.0, 0.7, 0.25),
            _table(0.65, 0.92, 0.28, 0.27, 4.0, 0.9, 0.75)]
    dirs = []
    for i, t in enumerate(runs):
        d = tmp_path / f"s{i}"
        d.mkdir()
        (d / "demo_table.json").write_text(json.dumps(t))
        dirs.append(str(d))
    rows = {r["figure"]: r for r in table_spread.spread(table_spread.read_tables(dirs))}
    diff = rows[f"{table.ROWS['rmsweb']}: difference vs baseline"]
    want = [0.03, 0.05, -0.01]
    assert diff["values"] == pytest.approx(want)
    assert diff["mean"] == pytest.approx(statistics.fmean(want)) and diff["sd"] == pytest.approx(statistics.stdev(want))
    assert (diff["min"], diff["max"]) == (pytest.approx(-0.01), pytest.approx(0.05))
    assert rows["collection reflection: mean steps (solved)"]["values"] == [None] * 3
    assert rows["collection reflection: mean steps (solved)"]["mean"] is None
    assert rows[f"{table.ROWS['sft']}: mean steps (all solved)"]["mean"] == pytest.approx(3.0)
    assert rows["salvage: accepted share"]["values"] == [0.5, 0.25, 0.75]

    out = tmp_path / "spread.md"
    assert table_spread.main([*dirs, f"--out={out}"]) == 0
    text = out.read_text()
    assert text == capsys.readouterr().out
    assert "| RMSWeb (SFT + mining + Salvage-DS): difference vs baseline | +3.0 pts | +5.0 pts | -1.0 pts | " \
           "+2.3 pts | -1.0 pts – +5.0 pts | 3.1 pts |" in text
    assert "| SFT (reflection-collected data): mean steps (all solved) | 2.00 | 3.00 | 4.00 | 3.00 | 2.00 – 4.00 | " \
           "1.00 |" in text


def test_a_run_without_a_table_is_named(tmp_path, capsys):
    with pytest.raises(UserError, match=r"nowhere/demo_table.json is missing: run the table stage"):
        table_spread.read_tables([tmp_path / "nowhere"])
    assert table_spread.main([str(tmp_path / "nowhere")]) == 2
    assert "demo_table.json is missing" in capsys.readouterr().err
