"""RMSWeb's table over several runs (e.g. the demo with run seeds 0, 1, 2): each figure per run, its mean
and its spread (min, max, sample standard deviation), so a reader sees how much of a difference is noise; then the
policy rows' differences pooled over the runs.

    python -m rmsweb_jax.stages.table_spread /tmp/demo_s0 /tmp/demo_s1 /tmp/demo_s2 [--out=spread.md]

Reads each run's demo_table.json (the table stage's output) and, for the pooled differences, the episodes of the
policy rows' eval stores it names. Pooled: every policy row against the baseline (SFT on reflection-collected
data), and each ablation row (when the runs have them) against RMSWeb, paired by (run, task, seed) over the held-out
pairs both played in each run:
- the pooled difference, its 95% paired bootstrap interval resampled within each (run, task), and the exact
  McNemar p of the pooled discordant pairs. This counts episode noise only: the runs share their held-out seeds;
- the runs' own differences, and a t interval over them (mean +- t(0.975, runs - 1) x sd / sqrt(runs)), which counts
  the run-to-run spread of training too (the wider, and with 3 runs a weak one);
- how many runs have the row ahead (a sign test, one-sided p = 2^-runs when all are).
When every run's table has RMSWeb over several Salvage-DS seeds (config.rl_seeds), RMSWeb - SFT averaged over each
run's seeds is pooled the same way (per held-out pair, the share of that run's Salvage-DS runs that solved it).
"""
from __future__ import annotations

import json
import math
import pathlib
import statistics
import sys

from rmsweb_jax import storage
from rmsweb_jax.errors import UserError, wants_help


def read_tables(workdirs) -> list[dict]:
    """Returns each workdir's demo_table.json, in order."""
    from rmsweb_jax.stages.table import NAME  # deferred: the table stage imports every stage (and JAX); --help does not
    tables = []
    for workdir in workdirs:
        path = storage.as_path(workdir) / f"{NAME}.json"  # a local run, or one on a bucket (gs://)
        if not path.is_file():
            raise UserError(f"{path} is missing: run the table stage in {workdir} first")
        tables.append(json.loads(path.read_text()))
    return tables


def figures(table: dict) -> dict[str, float | None]:
    """Returns {figure name: value} of one table: collection rates and steps, each policy row's success,
    difference vs the baseline and its interval, the mining and Salvage-DS shares, the transfer diagnostics."""
    out = {}
    for key in ("plain", "reflection"):
        c = table["collection"][key]
        out[f"collection {key}: success@1"] = c["success_at_1"]
        out[f"collection {key}: success@<=K"] = c["success_at_le_K"]
        out[f"collection {key}: mean steps (solved)"] = c["mean_steps_solved"]
    for r in table["policies"]["rows"]:
        out[f"{r['row']}: success"] = r["success"]
        v = r["vs_baseline"]
        if v is not None and v["difference"] is not None:
            out[f"{r['row']}: difference vs baseline"] = v["difference"]
            out[f"{r['row']}: paired CI low"] = v["ci95"][0]
            out[f"{r['row']}: paired CI high"] = v["ci95"][1]
    for r in table["policies"]["rows"]:
        out[f"{r['row']}: mean steps (all solved)"] = r["mean_steps_all_solved"]
    out["mining: critical share"] = table["mining"]["critical_share"]
    sal = table.get("salvage")
    if sal is not None:
        out["salvage: accepted share"] = sal["accepted_share"]
        out["salvage: anchored share"] = sal["anchored_share"]
    out.update(transfer_figures(table.get("transfer")))
    return out


def transfer_figures(tr: dict | None) -> dict[str, float | None]:
    """Returns the transfer diagnostics of one table ({} for a table written without them): SFT's and RMSWeb's
    sampled accuracy on Salvage-DS's training states and its paired difference, and their greedy step accuracy on
    the held-out task groups' steps (absent when the run held none out)."""
    if tr is None:
        return {}
    t, h = tr["training_states"], tr["held_out_steps"]
    out = {"transfer: training states, SFT sampled accuracy": t["sft"]["accuracy"],
           "transfer: training states, RMSWeb sampled accuracy": t["rmsweb"]["accuracy"],
           "transfer: training states, difference": t["difference"]}
    if h is not None:
        out["transfer: held-out steps, SFT greedy accuracy"] = h["sft"]["accuracy"]
        out["transfer: held-out steps, RMSWeb greedy accuracy"] = h["rmsweb"]["accuracy"]
        out["transfer: held-out steps, difference"] = h["rmsweb"]["accuracy"] - h["sft"]["accuracy"]
    return out


def spread(tables: list[dict]) -> list[dict]:
    """Returns one row per figure (in the first table's order): its values per run, mean, min, max and sample
    standard deviation over the runs that have it (None where no run does; sd None for fewer than 2)."""
    per_run = [figures(t) for t in tables]
    names = list(dict.fromkeys(name for f in per_run for name in f))
    rows = []
    for name in names:
        values = [f.get(name) for f in per_run]
        present = [v for v in values if v is not None]
        rows.append({"figure": name, "values": values,
                     "mean": statistics.fmean(present) if present else None,
                     "min": min(present) if present else None, "max": max(present) if present else None,
                     "sd": statistics.stdev(present) if len(present) > 1 else None})
    return rows


# t(0.975, df) for df = 1..10: the runs' own-difference interval (scipy is not a dependency).
T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228)
RMSWEB = "rmsweb"


def _episodes(table: dict, key: str, workdir) -> dict:
    """Returns {(task, seed): first-attempt episode} of a policy row's eval store, on the held-out pairs the table
    counted (all the store's pairs for a table written before it listed them)."""
    from rmsweb_jax.evaluate.report import read_episodes  # deferred, as read_tables
    row = next(r for r in table["policies"]["rows"] if r["key"] == key)
    store = row["store_dir"]
    if not storage.as_path(store).is_dir():
        raise UserError(f"{store} is missing: the eval store of row {row['row']!r} of {workdir} (the pooled "
                        "differences read every row's episodes)")
    return read_episodes(store, table["policies"].get("pair_list"))


def pooled(workdirs, tables: list[dict], *, samples: int = 10_000, seed: int = 0) -> list[dict]:
    """Returns one comparison per policy row present in every run: each row against the baseline, each ablation row
    against RMSWeb, pooled over the runs (see the module): row, against, n pairs, difference, ci95 (paired
    bootstrap within (run, task)), mcnemar (b: only the row solved, c: only the other, p), per-run differences,
    runs_ci95 (t over the runs' differences; None for one run), runs_ahead."""
    from rmsweb_jax.evaluate.report import compare_episodes
    from rmsweb_jax.stages.table import ABLATION_NAMES, BASELINE
    ablations = set(ABLATION_NAMES)
    keys = [r["key"] for r in tables[0]["policies"]["rows"]]
    keys = [k for k in keys if all(k in {r["key"] for r in t["policies"]["rows"]} for t in tables)]
    names = {r["key"]: r["row"] for r in tables[0]["policies"]["rows"]}
    comparisons = [(k, BASELINE) for k in keys if k != BASELINE]
    comparisons += [(k, RMSWEB) for k in keys if k in ablations and RMSWEB in keys]
    cache: dict = {}

    def episodes(run: int, key: str) -> dict:
        """{("run/task", seed): episode}: each run's tasks are strata of their own."""
        if (run, key) not in cache:
            cache[run, key] = {(f"{run}/{task}", s): t
                               for (task, s), t in _episodes(tables[run], key, workdirs[run]).items()}
        return cache[run, key]

    out = []
    for key, other in comparisons:
        mine, theirs, per_run = {}, {}, []
        for run in range(len(tables)):
            run_mine, run_theirs = episodes(run, key), episodes(run, other)
            shared = set(run_mine) & set(run_theirs)
            if not shared:
                raise UserError(f"{workdirs[run]}: rows {key!r} and {other!r} share no held-out pair")
            per_run.append(sum(run_mine[p].success - run_theirs[p].success for p in shared) / len(shared))
            mine.update(run_mine)
            theirs.update(run_theirs)
        c = compare_episodes(mine, theirs, bootstrap_samples=samples, seed=seed)
        out.append({"row": names[key], "key": key, "against": names[other], "n": c["n"],
                    "difference": c["difference"], "ci95": c["ci95"], "mcnemar": c["mcnemar"],
                    "per_run": per_run, "runs_ci95": runs_interval(per_run), "runs_ahead": sum(d > 0 for d in per_run)})
    mean = pooled_rl_mean(workdirs, tables, episodes, names[BASELINE], samples=samples, seed=seed)
    return out + ([mean] if mean is not None else [])


def runs_interval(per_run: list[float]) -> list[float] | None:
    """Returns the t interval of the runs' own differences (None for one run)."""
    if len(per_run) < 2:
        return None
    half = T975[min(len(per_run), len(T975) + 1) - 2] * statistics.stdev(per_run) / math.sqrt(len(per_run))
    return [statistics.fmean(per_run) - half, statistics.fmean(per_run) + half]


def pooled_rl_mean(workdirs, tables: list[dict], episodes, against: str, *, samples: int, seed: int) -> dict | None:
    """Returns pooled()'s comparison for RMSWeb - SFT averaged over each run's Salvage-DS seeds (the tables'
    rl_mean; `episodes(run, key)` reads a row's episodes keyed by ("run/task", seed)); mcnemar is None (the pairs'
    values are shares, not solved or not). None unless every table has rl_mean."""
    from rmsweb_jax.evaluate.report import compare_mean_success
    from rmsweb_jax.stages.table import BASELINE
    means = [t.get("rl_mean") for t in tables]
    if any(m is None for m in means):
        return None
    counts = [len(m["keys"]) for m in means]
    if len(set(counts)) > 1:
        raise UserError(f"the runs' tables average RMSWeb over {counts} Salvage-DS seeds: pool runs made with the "
                        "same config.rl_seeds (" + ", ".join(map(str, workdirs)) + ")")
    seed_runs, baseline, per_run = [{} for _ in range(counts[0])], {}, []
    for run, m in enumerate(means):
        run_seeds, run_baseline = [episodes(run, key) for key in m["keys"]], episodes(run, BASELINE)
        per_run.append(compare_mean_success(run_seeds, run_baseline, bootstrap_samples=samples,
                                            seed=seed)["difference"])
        for merged, one in zip(seed_runs, run_seeds):
            merged.update(one)
        baseline.update(run_baseline)
    c = compare_mean_success(seed_runs, baseline, bootstrap_samples=samples, seed=seed)
    return {"row": f"RMSWeb, mean over {counts[0]} Salvage-DS seeds", "key": means[0]["key"], "against": against,
            "n": c["n"], "difference": c["difference"], "ci95": c["ci95"], "mcnemar": None, "per_run": per_run,
            "runs_ci95": runs_interval(per_run), "runs_ahead": sum(d > 0 for d in per_run)}


def pooled_markdown(rows: list[dict], runs: int) -> str:
    """Returns the pooled differences as a markdown section."""
    lines = [f"## Pooled over the {runs} run{'s' if runs > 1 else ''}", "",
             "Paired by (run, task, seed). Bootstrap: episodes resampled within each (run, task), episode noise only "
             "(the runs share their held-out seeds). Over the runs: a t interval of the runs' own differences, "
             "which counts the run-to-run spread of training too.", "",
             "| row | against | pairs | difference | 95% paired bootstrap | McNemar p (only row / only other) "
             "| per run | t interval over the runs | runs ahead |", "|---" * 9 + "|"]
    for r in rows:
        ci, runs_ci = r["ci95"], r["runs_ci95"]
        m = r["mcnemar"]
        lines.append(f"| {r['row']} | {r['against']} | {r['n']} | {100 * r['difference']:+.1f} pts | "
                     f"{100 * ci[0]:+.1f} to {100 * ci[1]:+.1f} | "
                     + ("— (shares of runs)" if m is None else f"{m['p']:.3g} ({m['b']} / {m['c']})") + " | "
                     + ", ".join(f"{100 * d:+.1f}" for d in r["per_run"]) + " | "
                     + ("—" if runs_ci is None else f"{100 * runs_ci[0]:+.1f} to {100 * runs_ci[1]:+.1f}")
                     + f" | {r['runs_ahead']} of {len(r['per_run'])} |")
    return "\n".join(lines) + "\n"


def _fmt(name: str, x) -> str:
    if x is None:
        return "—"
    if "mean steps" in name:
        return f"{x:.2f}"
    if "difference" in name or "CI" in name:
        return f"{100 * x:+.1f} pts"
    return f"{100 * x:.1f}%"


def markdown(workdirs, rows: list[dict]) -> str:
    """Returns the spread as a markdown table, one column per run."""
    head = " | ".join(f"run {i} ({pathlib.Path(w).name})" for i, w in enumerate(workdirs))
    lines = [f"| figure | {head} | mean | min – max | sd |", "|---" * (len(workdirs) + 4) + "|"]
    for r in rows:
        name = r["figure"]
        sd = "—" if r["sd"] is None else (f"{r['sd']:.2f}" if "mean steps" in name else f"{100 * r['sd']:.1f} pts")
        lines.append(f"| {name} | " + " | ".join(_fmt(name, v) for v in r["values"]) +
                     f" | {_fmt(name, r['mean'])} | {_fmt(name, r['min'])} – {_fmt(name, r['max'])} | {sd} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    if wants_help(["table_spread", *argv]):
        print(__doc__)
        return 0
    args = [a for a in argv if not a.startswith("--out=")]
    out = [a.split("=", 1)[1] for a in argv if a.startswith("--out=")]
    if not args or any(a.startswith("-") for a in args):
        print(__doc__, file=sys.stderr)
        return 2
    try:
        tables = read_tables(args)
        text = markdown(args, spread(tables)) + "\n"
        if all("store_dir" in r for t in tables for r in t["policies"]["rows"]):
            text += pooled_markdown(pooled(args, tables), len(args))
        else:  # tables written before the rows named their stores
            text += "Pooled differences: not computed (a table's policy rows name no eval store).\n"
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if out:
        storage.write_text_atomic(out[0], text)
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
