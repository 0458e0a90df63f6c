"""table_spread: the table's figures over several runs, each recomputed here from the runs' demo_table.json."""
import json
import pathlib
import statistics

import numpy as np
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


def _transfer(sft_states, rmsweb_states, sft_steps, rmsweb_steps):
    return {"training_states": {"sft": {"accuracy": sft_states}, "rmsweb": {"accuracy": rmsweb_states},
                                "difference": rmsweb_states - sft_states},
            "held_out_steps": None if sft_steps is None else {"sft": {"accuracy": sft_steps},
                                                              "rmsweb": {"accuracy": rmsweb_steps}}}


def test_the_transfer_diagnostics_per_run(tmp_path):
    """Each run's transfer figures (training states and held-out steps, SFT, RMSWeb and their difference) are rows
    of the spread; a run whose table has no transfer section, or held no steps out, leaves its cells empty."""
    runs = [_table(0.6, 0.9, 0.3, 0.3, 2.0, 0.8, 0.5) for _ in range(3)]
    runs[0]["transfer"] = _transfer(0.20, 0.25, 0.35, 0.30)
    runs[1]["transfer"] = _transfer(0.10, 0.12, None, None)
    dirs = []
    for i, t in enumerate(runs):
        (tmp_path / f"s{i}").mkdir()
        (tmp_path / f"s{i}" / "demo_table.json").write_text(json.dumps(t))
        dirs.append(str(tmp_path / f"s{i}"))
    rows = {r["figure"]: r for r in table_spread.spread(table_spread.read_tables(dirs))}
    states = rows["transfer: training states, difference"]
    assert states["values"] == [pytest.approx(0.05), pytest.approx(0.02), None]
    assert states["mean"] == pytest.approx(0.035) and states["sd"] == pytest.approx(statistics.stdev([0.05, 0.02]))
    assert rows["transfer: training states, RMSWeb sampled accuracy"]["values"] == [0.25, 0.12, None]
    assert rows["transfer: held-out steps, SFT greedy accuracy"]["values"] == [0.35, None, None]
    steps = rows["transfer: held-out steps, difference"]
    assert steps["values"] == [pytest.approx(-0.05), None, None] and steps["sd"] is None
    text = table_spread.markdown(dirs, table_spread.spread(table_spread.read_tables(dirs)))
    assert "| transfer: held-out steps, difference | -5.0 pts | — | — | -5.0 pts |" in text


def test_a_run_without_a_table_is_named(tmp_path, capsys):
    with pytest.raises(UserError, match=r"nowhere/demo_table.json is missing: run the table stage"):
        table_spread.read_tables([tmp_path / "nowhere"])
    assert table_spread.main([str(tmp_path / "nowhere")]) == 2
    assert "demo_table.json is missing" in capsys.readouterr().err


# Two runs' held-out outcomes per row, (task, seed) -> solved; each run's rows are written to real eval stores.
TASKS = [("t-a", s) for s in range(6)] + [("t-b", s) for s in range(4)]
OUTCOMES = [
    {"sft": [1, 0, 0, 1, 0, 1, 0, 0, 1, 0], "rmsweb": [1, 1, 0, 1, 1, 1, 0, 1, 1, 0],
     "salvage_anchor_off": [0, 1, 0, 1, 0, 0, 0, 1, 1, 0]},
    {"sft": [0, 0, 1, 1, 0, 0, 1, 0, 0, 0], "rmsweb": [0, 1, 1, 0, 0, 1, 1, 0, 1, 1],
     "salvage_anchor_off": [0, 1, 1, 0, 0, 1, 0, 0, 0, 1]},
]


def _run_with_stores(root, outcomes):
    from rmsweb_jax.collect.store_fixture import retry_group
    from tests.settings import store_writer
    rows = []
    for key, solved in outcomes.items():
        store = root / "eval" / key
        with store_writer(store, flush_every_tasks=3, policy=key) as writer:
            for (task, seed), ok in zip(TASKS, solved):
                writer.add_group(retry_group(task, seed, solved_at=1 if ok else None, attempts=1, policy=key))
        name = table.ROWS.get(key) or dict((a[0], a[1]) for a in table.ABLATIONS).get(key, key)
        rows.append({"key": key, "row": name, "store_dir": str(store), "success": sum(solved) / len(solved),
                     "mean_steps_all_solved": 2.0, "vs_baseline": None})
    t = _table(0.6, 0.9, 0.3, 0.3, 2.0, 0.8, 0.5)
    t["policies"]["rows"] = rows
    (root / "demo_table.json").write_text(json.dumps(t))
    return str(root)


def test_pooled_differences_over_the_runs_from_the_eval_stores(tmp_path, capsys):
    from scipy import stats as scipy_stats
    dirs = [_run_with_stores(tmp_path / f"s{i}", o) for i, o in enumerate(OUTCOMES)]
    got = {(r["key"], r["against"]): r for r in table_spread.pooled(dirs, table_spread.read_tables(dirs), samples=4000)}
    assert set(got) == {("rmsweb", table.ROWS["sft"]), ("salvage_anchor_off", table.ROWS["sft"]),
                        ("salvage_anchor_off", table.ROWS["rmsweb"])}
    rng = np.random.default_rng(1)
    for (key, against), r in got.items():
        other = "sft" if against == table.ROWS["sft"] else "rmsweb"
        per_run = [np.subtract(o[key], o[other]) for o in OUTCOMES]
        diffs = np.concatenate(per_run)
        assert r["n"] == 20 and r["difference"] == pytest.approx(diffs.mean())
        assert r["per_run"] == pytest.approx([d.mean() for d in per_run])
        b, c = int((diffs > 0).sum()), int((diffs < 0).sum())
        assert r["mcnemar"] == {"b": b, "c": c, "p": pytest.approx(scipy_stats.binomtest(b, b + c, 0.5).pvalue)}
        means = [d.mean() for d in per_run]
        half = scipy_stats.t.ppf(0.975, 1) * statistics.stdev(means) / np.sqrt(2)
        assert r["runs_ci95"] == pytest.approx([np.mean(means) - half, np.mean(means) + half], abs=1e-3)
        assert r["runs_ahead"] == sum(m > 0 for m in means)
        # the bootstrap within (run, task), done here by hand: the interval's ends within 1.5 points
        strata = [d[:6] for d in per_run] + [d[6:] for d in per_run]
        boots = sum(rng.choice(s, size=(20000, len(s))).sum(axis=1) for s in strata) / 20
        assert r["ci95"] == pytest.approx(list(np.percentile(boots, [2.5, 97.5])), abs=0.015)

    assert table_spread.main(dirs) == 0
    text = capsys.readouterr().out
    assert "## Pooled over the 2 runs" in text
    r = got[("rmsweb", table.ROWS["sft"])]
    assert (f"| {table.ROWS['rmsweb']} | {table.ROWS['sft']} | 20 | {100 * r['difference']:+.1f} pts |") in text


def test_a_missing_eval_store_is_named(tmp_path):
    dirs = [_run_with_stores(tmp_path / "s0", OUTCOMES[0])]
    missing = tmp_path / "s0" / "eval" / "rmsweb"
    import shutil
    shutil.rmtree(missing)
    with pytest.raises(UserError, match=rf"{missing} is missing: the eval store of row"):
        table_spread.pooled(dirs, table_spread.read_tables(dirs))


def test_pooled_counts_only_the_held_out_pairs_the_table_counted(tmp_path):
    """A store may hold more episodes than the table's held-out pairs (e.g. an eval rerun with more seeds into the
    same store): the pooled differences count the table's pair list only, as the table itself did."""
    dirs = [_run_with_stores(tmp_path / f"s{i}", o) for i, o in enumerate(OUTCOMES)]
    counted = TASKS[:3] + TASKS[6:9]
    for d in dirs:
        path = pathlib.Path(d) / "demo_table.json"
        t = json.loads(path.read_text())
        t["policies"]["pair_list"] = [list(p) for p in counted]
        path.write_text(json.dumps(t))
    got = {(r["key"], r["against"]): r for r in table_spread.pooled(dirs, table_spread.read_tables(dirs), samples=500)}
    kept = [TASKS.index(p) for p in counted]
    r = got[("rmsweb", table.ROWS["sft"])]
    per_run = [np.subtract(o["rmsweb"], o["sft"])[kept] for o in OUTCOMES]
    assert r["n"] == 12
    assert r["difference"] == pytest.approx(np.concatenate(per_run).mean())
    assert r["per_run"] == pytest.approx([d.mean() for d in per_run])


# Two runs with RMSWeb over three Salvage-DS seeds each (config.rl_seeds = 2): the table's rl_mean names the rows.
RL_KEYS = ["rmsweb", f"{table.RL_SEED_PREFIX}1", f"{table.RL_SEED_PREFIX}2"]
RL_OUTCOMES = [
    {**OUTCOMES[0], RL_KEYS[1]: [0, 1, 0, 1, 1, 0, 0, 1, 1, 1], RL_KEYS[2]: [1, 0, 0, 0, 1, 1, 0, 0, 1, 0]},
    {**OUTCOMES[1], RL_KEYS[1]: [0, 0, 1, 1, 1, 1, 1, 0, 0, 1], RL_KEYS[2]: [0, 0, 0, 0, 0, 1, 1, 0, 1, 1]},
]


def _rl_run(root, outcomes, keys=RL_KEYS):
    d = _run_with_stores(root, outcomes)
    path = pathlib.Path(d) / "demo_table.json"
    t = json.loads(path.read_text())
    t["rl_mean"] = {"key": table.RL_MEAN, "keys": list(keys)}
    path.write_text(json.dumps(t))
    return d


def test_rmsweb_averaged_over_the_salvage_ds_seeds_is_pooled_per_pair(tmp_path, capsys):
    dirs = [_rl_run(tmp_path / f"s{i}", o) for i, o in enumerate(RL_OUTCOMES)]
    got = {r["key"]: r for r in table_spread.pooled(dirs, table_spread.read_tables(dirs), samples=20000)
           if r["against"] == table.ROWS["sft"]}
    r = got[table.RL_MEAN]
    assert r["row"] == "RMSWeb, mean over 3 Salvage-DS seeds" and r["mcnemar"] is None
    # per pair: the share of the run's three Salvage-DS runs that solved it, minus SFT's outcome
    per_run = [np.mean([o[k] for k in RL_KEYS], axis=0) - np.asarray(o["sft"]) for o in RL_OUTCOMES]
    assert r["n"] == 20 and r["difference"] == pytest.approx(np.concatenate(per_run).mean())
    assert r["per_run"] == pytest.approx([d.mean() for d in per_run])
    # it is the mean of the seeds' own rows, each of which is pooled against SFT too
    assert r["difference"] == pytest.approx(np.mean([got[k]["difference"] for k in RL_KEYS]))
    rng = np.random.default_rng(2)
    strata = [d[:6] for d in per_run] + [d[6:] for d in per_run]
    boots = sum(rng.choice(s, size=(20000, len(s))).sum(axis=1) for s in strata) / 20
    assert r["ci95"] == pytest.approx(list(np.percentile(boots, [2.5, 97.5])), abs=0.015)
    assert table_spread.main(dirs) == 0
    assert "| RMSWeb, mean over 3 Salvage-DS seeds | SFT (reflection-collected data) | 20 |" in capsys.readouterr().out


def test_runs_with_different_numbers_of_salvage_ds_seeds_are_not_pooled(tmp_path):
    dirs = [_rl_run(tmp_path / "s0", RL_OUTCOMES[0]), _rl_run(tmp_path / "s1", RL_OUTCOMES[1], RL_KEYS[:2])]
    with pytest.raises(UserError, match=r"average RMSWeb over \[3, 2\] Salvage-DS seeds: pool runs made with the "
                                        r"same config.rl_seeds"):
        table_spread.pooled(dirs, table_spread.read_tables(dirs), samples=100)
