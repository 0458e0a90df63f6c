"""The evaluation report, computed from the policies' stores alone: eval_report.json, .md and .png.

An *episode* is the first attempt of one (task, seed) pair in a policy's store (the eval stage
plays one attempt, no reflection); only the pairs the evaluation planned are read, so episodes
of an earlier, wider run in the same store do not leak in. *Success* is TrajectoryRecord.success:
for the programmatic judge the raw reward under the "solved" rule (checked on every record, as
the collection report does), for an LLM judge its verdict.

Why the figures are what they are:
- Judge errors (the judge could not decide) and episodes lost to browser faults (status
  "failed", after the collector's reruns) stay in the denominator as unsolved: dropping them
  would flatter a policy whose episodes break the browser or the judge. They are counted and
  listed apart from the failures so a reader can see how much of the gap they make.
- Per task: a 95% Wilson interval. Overall: Wilson (episodes taken as independent) beside a
  bootstrap that resamples whole tasks, because episodes of one task share its difficulty and
  the Wilson interval is then too narrow.
- Steps are compared only on episodes both policies solved: a policy that solves only the easy
  pairs would otherwise look faster.
- Cost is reported as means per episode (policy calls = steps, tokens, wall time, judge calls and
  tokens), the axis of the accuracy-cost trade-off.
"""
from __future__ import annotations

import json
import os
import pathlib
import statistics
from typing import Any, Iterable, Mapping, Sequence

from rmsweb_jax import storage
from rmsweb_jax.collect.records import FAULT_JUDGE, TrajectoryRecord
from rmsweb_jax.collect.report import check_store_success_rule
from rmsweb_jax.collect.store import StoreError, TrajectoryStore
from rmsweb_jax.evaluate import plots
from rmsweb_jax.evaluate.stats import (cluster_bootstrap_interval, mcnemar_exact, paired_bootstrap_interval,
                                       wilson_interval)
from rmsweb_jax.judges.base import ERROR
from rmsweb_jax.suites.success_rule import SOLVED, SUCCESS_RULES

LEVEL = 0.95
LOST = "failed"  # TrajectoryRecord.status of an episode lost to browser faults
# Per-episode cost fields: (report key, how it is read off a trajectory record).
COST_FIELDS = (
    ("policy_calls", lambda t: t.num_steps),
    ("prompt_tokens", lambda t: t.prompt_tokens),
    ("completion_tokens", lambda t: t.completion_tokens),
    ("wall_s", lambda t: t.wall_s),
    ("judge_calls", lambda t: t.verdict.calls),
    ("judge_prompt_tokens", lambda t: t.verdict.prompt_tokens),
    ("judge_completion_tokens", lambda t: t.verdict.completion_tokens),
)
SUCCESS_MEANING = ("the task solved on its one attempt: for the programmatic judge the raw reward under the "
                   f"{SOLVED!r} rule ({SUCCESS_RULES[SOLVED]}), for an LLM judge its verdict")
ALL = "(all)"  # the overall group in the success-by-task plot


def read_episodes(store_dir: str | os.PathLike, pairs: Iterable[tuple[str, int]] | None, *, off_record: bool = False
                  ) -> dict[tuple[str, int], TrajectoryRecord]:
    """Returns {(task id, seed): first attempt} for the pairs (None: every pair) in the store at
    `store_dir`: those played on record, or with `off_record` those a replay refused a request of (they
    are neither a success nor a failure of the policy, and are counted apart). Raises StoreError when a
    programmatic verdict in them is not the "solved" rule's."""
    wanted = None if pairs is None else {(str(t), int(s)) for t, s in pairs}
    with TrajectoryStore(store_dir) as store:
        groups = store.groups()
    episodes = {key: group[0] for key, group in sorted(groups.items())
                if (wanted is None or key in wanted) and group[0].attempt == 1
                and bool(group[0].off_record) == off_record}
    check_store_success_rule(episodes.values(), SOLVED, store_dir)
    return episodes


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _figures(episodes: Sequence[TrajectoryRecord]) -> dict[str, Any]:
    """Returns the counts, Wilson interval, steps and mean cost of a set of episodes."""
    n, solved = len(episodes), sum(t.success for t in episodes)
    lost = sum(t.status == LOST for t in episodes)
    judge_errors = sum(t.status != LOST and t.verdict.outcome == ERROR for t in episodes)
    steps = [t.num_steps for t in episodes if t.success]
    low, high = wilson_interval(solved, n)
    return {
        "episodes": n, "solved": solved, "success": solved / n if n else 0.0, "ci95": [low, high],
        "failures": n - solved - lost - judge_errors, "judge_errors": judge_errors, "browser_lost": lost,
        "browser_faults": sum(len(t.faults) for t in episodes),
        "parse_errors": sum(t.parse_errors for t in episodes),
        "mean_steps_solved": _mean(steps), "median_steps_solved": statistics.median(steps) if steps else None,
        "cost": {key: _mean([float(read(t)) for t in episodes]) for key, read in COST_FIELDS},
    }


def _apart(episodes: Iterable[TrajectoryRecord]) -> list[dict[str, Any]]:
    """Returns the judge errors and lost episodes, each with why (they count as unsolved)."""
    return [{"task": t.task_id, "seed": t.seed, "kind": "browser lost" if t.status == LOST else "judge error",
             "reason": t.verdict.reason} for t in episodes
            if t.status == LOST or t.verdict.outcome == ERROR]


def _policy_figures(store_dir: str | os.PathLike, episodes: Mapping[tuple[str, int], TrajectoryRecord],
                    pairs: set[tuple[str, int]] | None, *, bootstrap_samples: int, seed: int) -> dict[str, Any]:
    off = read_episodes(store_dir, pairs, off_record=True)
    if not episodes and off:
        raise StoreError(f"every episode in the store at {store_dir} went off its recording ({len(off)}, e.g. "
                         f"{next(iter(off.values())).off_record}): nothing to count; replay a policy that acts as "
                         "the recorded one did, or evaluate live")
    if not episodes:
        raise StoreError(f"the store at {store_dir} holds no first attempt of the {len(pairs or ())} evaluation "
                         f"pairs (e.g. {sorted(pairs or [])[:3]}); play them into it first")
    by_task: dict[str, list[TrajectoryRecord]] = {}
    for (task_id, _), t in sorted(episodes.items()):
        by_task.setdefault(task_id, []).append(t)
    overall = _figures(list(episodes.values()))
    overall["ci95_bootstrap"] = list(cluster_bootstrap_interval(
        {task: [float(t.success) for t in eps] for task, eps in by_task.items()},
        samples=bootstrap_samples, seed=seed, level=LEVEL))
    planned = set() if pairs is None else {(str(t), int(s)) for t, s in pairs}
    overall["off_record"] = len(off)
    return {"off_record": [{"task": t.task_id, "seed": t.seed, "url": t.off_record} for t in off.values()],
            "missing": sorted(planned - set(episodes) - set(off)), "overall": overall, "tasks": {task: _figures(eps) for task, eps in by_task.items()},
            "apart": _apart(episodes.values()),
            "policy_names": sorted({t.policy for t in episodes.values()}),
            "judges": sorted({t.verdict.judge for t in episodes.values() if t.verdict.judge != FAULT_JUDGE})}


def policy_figures(store_dir: str | os.PathLike, pairs: set[tuple[str, int]] | None, *, bootstrap_samples: int,
                   seed: int) -> dict[str, Any]:
    """Returns one policy's figures from its store, over `pairs` (None: every pair stored):
    "overall" and "tasks"[task id] (episodes, solved, success, ci95 (Wilson), failures,
    judge_errors, browser_lost, mean/median steps on solved episodes, mean "cost" per episode),
    overall "ci95_bootstrap" (tasks resampled), "apart" (judge errors and lost episodes listed),
    "missing" (planned pairs with no episode). Raises StoreError when none of `pairs` is stored."""
    return _policy_figures(store_dir, read_episodes(store_dir, pairs), pairs, bootstrap_samples=bootstrap_samples,
                           seed=seed)


def compare_episodes(a: Mapping[tuple[str, int], TrajectoryRecord], b: Mapping[tuple[str, int], TrajectoryRecord], *,
                     bootstrap_samples: int, seed: int) -> dict[str, Any]:
    """Returns `compare`'s figures for two policies' episodes keyed by (stratum, seed): the pairs both played,
    the bootstrap resampled within each stratum (a task; "run/task" when pooling runs)."""
    keys = sorted(set(a) & set(b))
    out: dict[str, Any] = {"n": len(keys), "tasks": len({task for task, _ in keys})}
    if not keys:
        return {**out, "success_a": None, "success_b": None, "difference": None, "ci95": None,
                "mcnemar": {"b": 0, "c": 0, "p": 1.0},
                "steps_both_solved": {"n_both": 0, "mean_a": None, "mean_b": None, "mean_difference": None}}
    sa = [float(a[k].success) for k in keys]
    sb = [float(b[k].success) for k in keys]
    only_a = sum(x > y for x, y in zip(sa, sb))
    only_b = sum(y > x for x, y in zip(sa, sb))
    both = [k for k in keys if a[k].success and b[k].success]
    steps_a, steps_b = [a[k].num_steps for k in both], [b[k].num_steps for k in both]
    return {**out, "success_a": sum(sa) / len(keys), "success_b": sum(sb) / len(keys),
            "difference": (sum(sa) - sum(sb)) / len(keys),
            "ci95": list(paired_bootstrap_interval(sa, sb, [task for task, _ in keys], samples=bootstrap_samples,
                                                   seed=seed, level=LEVEL)),
            "mcnemar": {"b": only_a, "c": only_b, "p": mcnemar_exact(only_a, only_b)},
            "steps_both_solved": {"n_both": len(both), "mean_a": _mean(steps_a), "mean_b": _mean(steps_b),
                                  "mean_difference": _mean([x - y for x, y in zip(steps_a, steps_b)])}}


def compare_mean_success(runs: Sequence[Mapping[tuple[str, int], TrajectoryRecord]],
                         b: Mapping[tuple[str, int], TrajectoryRecord], *, bootstrap_samples: int,
                         seed: int) -> dict[str, Any]:
    """Returns several runs of one policy (e.g. one per RL seed) against policy b, on the pairs every run and b
    played: n, runs, success_a (per pair the share of the runs that solved it, averaged), success_b, difference
    (success_a - success_b), ci95 (paired bootstrap of those per-pair values within each stratum: episode noise
    given these runs), per_run (each run's own difference on the same pairs). ValueError when no pair is shared."""
    keys = sorted(set(b).intersection(*(set(r) for r in runs))) if runs else []
    if not keys:
        raise ValueError(f"compare_mean_success: {len(runs)} runs and the other policy share no pair")
    sa = [sum(float(r[k].success) for r in runs) / len(runs) for k in keys]
    sb = [float(b[k].success) for k in keys]
    per_run = [sum(float(r[k].success) - float(b[k].success) for k in keys) / len(keys) for r in runs]
    return {"n": len(keys), "runs": len(runs), "success_a": sum(sa) / len(keys), "success_b": sum(sb) / len(keys),
            "difference": (sum(sa) - sum(sb)) / len(keys),
            "ci95": list(paired_bootstrap_interval(sa, sb, [task for task, _ in keys], samples=bootstrap_samples,
                                                   seed=seed, level=LEVEL)),
            "per_run": per_run}


def compare(store_a: str | os.PathLike, store_b: str | os.PathLike, pairs: set[tuple[str, int]] | None, *,
            bootstrap_samples: int, seed: int) -> dict[str, Any]:
    """Returns the paired comparison of two policies on the pairs of `pairs` both played: n,
    success_a, success_b, difference (a - b), ci95 (paired bootstrap within tasks), mcnemar
    (b: only a solved, c: only b solved, exact p), steps_both_solved (n_both, mean_a, mean_b,
    mean_difference) on the pairs both solved. Figures are None when no pair was played by both."""
    return compare_episodes(read_episodes(store_a, pairs), read_episodes(store_b, pairs),
                    bootstrap_samples=bootstrap_samples, seed=seed)


def build_report(policies: Sequence[Mapping[str, Any]], pairs: set[tuple[str, int]] | None,
                 comparisons: Sequence[tuple[str, str]], *, bootstrap_samples: int, seed: int) -> dict[str, Any]:
    """Returns the whole report: per policy (dicts with "id", "label", "store_dir") its figures
    (policy_figures), and each (label a, label b) of `comparisons` compared (compare). Raises
    ValueError for a repeated label or a comparison naming an unknown one."""
    labels = [p["label"] for p in policies]
    repeated = sorted({label for label in labels if labels.count(label) > 1})
    if repeated:
        raise ValueError(f"evaluation policies need distinct labels; {repeated} appear more than once in {labels}")
    for pair in comparisons:
        unknown = [label for label in pair if label not in labels]
        if unknown or len(pair) != 2:
            raise ValueError(f"comparison {pair!r}: expected two of the policy labels {labels}, unknown {unknown}")
    episodes, rows = {}, []
    for p in policies:
        episodes[p["label"]] = read_episodes(p["store_dir"], pairs)
        figures = _policy_figures(p["store_dir"], episodes[p["label"]], pairs, bootstrap_samples=bootstrap_samples,
                                  seed=seed)
        rows.append({"id": p["id"], "label": p["label"], "store_dir": str(p["store_dir"]), **figures})
    return {
        "success_rule": SOLVED, "success_meaning": SUCCESS_MEANING, "pairs": None if pairs is None else len(pairs),
        "bootstrap": {"samples": bootstrap_samples, "seed": seed, "level": LEVEL},
        "policies": rows,
        "comparisons": [{"a": a, "b": b, **compare_episodes(episodes[a], episodes[b],
                                                             bootstrap_samples=bootstrap_samples, seed=seed)}
                        for a, b in comparisons],
    }


# --- markdown -----------------------------------------------------------------------------------
def pct(value: float | None) -> str:
    """Returns a share as a percentage with one decimal ("—" for None): the reports' and the table's format."""
    return "—" if value is None else f"{100 * value:.1f}%"


def _ci(interval: Sequence[float] | None) -> str:
    return "—" if interval is None else f"{100 * interval[0]:.1f}–{100 * interval[1]:.1f}%"


def _num(value: float | None, digits: int = 1) -> str:
    return "—" if value is None else f"{value:,.{digits}f}"


def _steps(row: Mapping[str, Any]) -> str:
    if row["mean_steps_solved"] is None:
        return "—"
    return f"{row['mean_steps_solved']:.1f} / {row['median_steps_solved']:.1f}"


def markdown(report: Mapping[str, Any]) -> str:
    """Returns the report as markdown: summary, per-policy task tables, cost, comparisons, and the
    episodes counted as unsolved without a failure (judge errors, browser-lost)."""
    boot = report["bootstrap"]
    lines = [
        "# Evaluation report", "",
        f"Success is {report['success_meaning']}; one episode per (task, seed) pair. Judge errors and episodes "
        "lost to browser faults count as unsolved (they stay in the denominator) but are counted apart from "
        "failures and listed at the end. Per-task intervals are 95% Wilson intervals; the overall success has "
        f"both a Wilson interval and a bootstrap interval resampling whole tasks ({boot['samples']:,} samples, "
        f"seed {boot['seed']}), which is the honest one when tasks differ in difficulty.", "",
        "## Summary", "",
        "| policy | solved / episodes | success | 95% CI (Wilson) | 95% CI (task bootstrap) | mean / median steps "
        "(solved) | failures | judge errors | browser lost |", "|---|---|---|---|---|---|---|---|---|"]
    for p in report["policies"]:
        o = p["overall"]
        lines.append(f"| {p['label']} | {o['solved']} / {o['episodes']} | {pct(o['success'])} | {_ci(o['ci95'])} | "
                     f"{_ci(o['ci95_bootstrap'])} | {_steps(o)} | {o['failures']} | {o['judge_errors']} | "
                     f"{o['browser_lost']} |")
    for p in report["policies"]:
        o = p["overall"]
        lines += ["", f"## {p['label']}", "",
                  f"Policy id `{p['id']}`, store `{p['store_dir']}`; judge: {', '.join(p['judges']) or '—'}."]
        if p["missing"]:
            count = len(p["missing"])
            lines += ["", f"**{count} planned pair{' has' if count == 1 else 's have'} no episode in the store** "
                      f"(e.g. {', '.join(f'{t}#{s}' for t, s in p['missing'][:5])}): the figures cover the rest."]
        lines += ["", "| task | solved / episodes | success | 95% CI (Wilson) | 95% CI (task bootstrap) | "
                  "mean / median steps (solved) | failures | judge errors | browser lost |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for task, r in p["tasks"].items():
            lines.append(f"| {task} | {r['solved']} / {r['episodes']} | {pct(r['success'])} | {_ci(r['ci95'])} | — | "
                         f"{_steps(r)} | {r['failures']} | {r['judge_errors']} | {r['browser_lost']} |")
        lines.append(f"| **all** | {o['solved']} / {o['episodes']} | {pct(o['success'])} | {_ci(o['ci95'])} | "
                     f"{_ci(o['ci95_bootstrap'])} | {_steps(o)} | {o['failures']} | {o['judge_errors']} | "
                     f"{o['browser_lost']} |")
    lines += ["", "## Cost per episode (means)", "",
              "Policy calls are steps; tokens as the policy's and the judge's endpoints reported them (0 where "
              "nothing was counted: the scripted teacher, the programmatic judge).", "",
              "| policy | task | policy calls | prompt tokens | completion tokens | wall s | judge calls | "
              "judge prompt tokens | judge completion tokens |", "|---|---|---|---|---|---|---|---|---|"]
    for p in report["policies"]:
        for task, r in [*p["tasks"].items(), ("**all**", p["overall"])]:
            c = r["cost"]
            lines.append(f"| {p['label']} | {task} | {_num(c['policy_calls'])} | {_num(c['prompt_tokens'], 0)} | "
                         f"{_num(c['completion_tokens'], 0)} | {_num(c['wall_s'], 2)} | {_num(c['judge_calls'])} | "
                         f"{_num(c['judge_prompt_tokens'], 0)} | {_num(c['judge_completion_tokens'], 0)} |")
    if report["comparisons"]:
        lines += ["", "## Comparisons (paired on the (task, seed) pairs both played)", "",
                  "Difference = success of A − success of B; its interval resamples pairs within each task. McNemar's "
                  "exact test uses the discordant pairs (b: only A solved, c: only B solved). Steps are compared "
                  "only on the pairs both solved.", "",
                  "| A vs B | pairs | success A | success B | difference | 95% CI (paired bootstrap) | b / c | "
                  "McNemar p | both solved | mean steps A / B | steps difference |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        for c in report["comparisons"]:
            s, m = c["steps_both_solved"], c["mcnemar"]
            diff = "—" if c["difference"] is None else f"{100 * c['difference']:+.1f} points"
            ci = "—" if c["ci95"] is None else f"{100 * c['ci95'][0]:+.1f} to {100 * c['ci95'][1]:+.1f}"
            step_diff = "—" if s["mean_difference"] is None else f"{s['mean_difference']:+.2f}"
            lines.append(f"| {c['a']} vs {c['b']} | {c['n']} | {pct(c['success_a'])} | {pct(c['success_b'])} | "
                         f"{diff} | {ci} | {m['b']} / {m['c']} | {m['p']:.3g} | {s['n_both']} | "
                         f"{_num(s['mean_a'], 2)} / {_num(s['mean_b'], 2)} | {step_diff} |")
    lines += ["", "## Judge errors and browser-lost episodes (counted as unsolved)", ""]
    apart = [(p["label"], e) for p in report["policies"] for e in p["apart"]]
    if not apart:
        lines.append("None.")
    for label, e in apart:
        reason = " ".join(str(e["reason"]).split())
        lines.append(f"- {label}: {e['task']}#{e['seed']} — {e['kind']}: {reason[:200]}")
    return "\n".join(lines) + "\n"


def success_rows(report: Mapping[str, Any]) -> dict[str, dict[str, dict[str, Any]]]:
    """Returns the success-by-task plot's rows: per policy label, per task its success and Wilson
    interval, and the overall success under ALL with its task-bootstrap interval."""
    return {p["label"]: {**{task: {"success": r["success"], "ci95": r["ci95"]} for task, r in p["tasks"].items()},
                         ALL: {"success": p["overall"]["success"], "ci95": p["overall"]["ci95_bootstrap"]}}
            for p in report["policies"]}


def write_report(report: Mapping[str, Any], out_dir: str | os.PathLike, name: str = "eval_report"
                 ) -> dict[str, pathlib.Path]:
    """Returns {"json", "md", "png"}: the paths out_dir/<name>.{json,md,png} where the report was written."""
    out_dir = storage.as_path(out_dir)  # local, or gs://
    paths = {ext: out_dir / f"{name}.{ext}" for ext in ("json", "md", "png")}
    storage.write_text_atomic(paths["json"], json.dumps(report, indent=2))
    storage.write_text_atomic(paths["md"], markdown(report))
    plots.success_by_task_png(success_rows(report), paths["png"], title="success by task (%), whiskers: 95% "
                              f"interval (tasks: Wilson; {ALL}: bootstrap over tasks)")
    return paths
