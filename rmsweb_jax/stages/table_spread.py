"""RMSWeb's table over several runs (e.g. the demo with run seeds 0, 1, 2): each figure per run, its mean
and its spread (min, max, sample standard deviation), so a reader sees how much of a difference is noise.

    python -m rmsweb_jax.stages.table_spread /tmp/demo_s0 /tmp/demo_s1 /tmp/demo_s2 [--out=spread.md]

Reads each run's demo_table.json (the table stage's output) and nothing else.
"""
from __future__ import annotations

import json
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
    difference vs the baseline and its interval, the mining and Salvage-DS shares."""
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


def _fmt(name: str, x) -> str:
    if x is None:
        return "—"
    if "steps" in name:
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
        sd = "—" if r["sd"] is None else (f"{r['sd']:.2f}" if "steps" in name else f"{100 * r['sd']:.1f} pts")
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
        text = markdown(args, spread(read_tables(args)))
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if out:
        storage.write_text_atomic(out[0], text)
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
