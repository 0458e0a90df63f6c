"""The collection report, computed from the store's records alone: report.json, .md and .png.

Figures (a "group" is every attempt of one task with one seed):
- success@1: share of groups solved on attempt 1; success@<=k: solved within k attempts.
- yield gain: success@<=K - success@1 (and the ratio).
- mean steps of solved attempts: first-attempt successes vs retried successes (and, for the
  retried groups, the steps of their failed first attempt).
- retry mode: how failed attempts were retried (collect.retry_mode, from store.json): with
  reflections in context ("reflection") or without ("plain"); None when the store records none.
- success rule: the rule (config.collect.success) the programmatic verdicts were made under;
  the report checks every stored programmatic verdict against it.
- raw reward: the suite's own reward beside the verdict (mean, partial rewards), per task too.
- browser faults: faults, attempts rerun after them (same attempt number, not retries), attempts
  lost to them.
- judge: verdicts, endpoint calls, errors; policy: steps acted, reflections written, tokens.
"""
from __future__ import annotations

import json
import os
from typing import Any, Iterable

from PIL import Image, ImageDraw

from rmsweb_jax import storage
from rmsweb_jax.collect.records import FAULT_JUDGE, TrajectoryRecord
from rmsweb_jax.collect.store import RETRY_MODE_MEANINGS, StoreError, TrajectoryStore
from rmsweb_jax.suites.success_rule import SUCCESS_RULES, check_success_rule, counts_as_success, is_solved

PROGRAMMATIC = "programmatic"  # Verdict.judge of the reward-reading judge (judges/programmatic.py)


def _mean(values: list[float]) -> float | None:
    return round(sum(values) / len(values), 3) if values else None


def check_store_success_rule(trajectories: Iterable[TrajectoryRecord], rule: str, directory) -> None:
    """Raises StoreError naming the first programmatic verdict in `trajectories` (of the store at
    `directory`) that the success rule `rule` would not give."""
    # A store collected under the other rule has other groups ended, retried and trained on:
    # its figures cannot be relabelled, so a mismatch is an error, not a silent recount.
    for t in trajectories:
        if t.verdict.judge == PROGRAMMATIC and t.reward is not None and t.success != counts_as_success(t.reward, rule):
            raise StoreError(
                f"{t.request_id} in the store at {directory}: raw reward {t.reward:g} was judged "
                f"{'a success' if t.success else 'a failure'}, which the success rule {rule!r} "
                f"({SUCCESS_RULES[rule]}) does not give; the store was collected under collect.success="
                f"{_other_rule(rule)!r}: use that rule with this store, or collect into a new store")


def _other_rule(rule: str) -> str:
    # Two rules: a verdict one rule would not give is the other's.
    return next(r for r in SUCCESS_RULES if r != rule)


def _raw_rewards(trajectories: list[TrajectoryRecord]) -> dict[str, Any]:
    rewards = [t.reward for t in trajectories if t.reward is not None]
    return {"mean": _mean(rewards), "mean_first_attempt": _mean([t.reward for t in trajectories
                                                                   if t.reward is not None and t.attempt == 1]),
            "attempts_with_reward": len(rewards), "partial": sum(0 < r and not is_solved(r) for r in rewards)}


def compute_report(store: TrajectoryStore, attempts: int | None = None, *, success_rule: str) -> dict[str, Any]:
    """Returns the report's figures computed from `store`'s committed records; `attempts` (K)
    defaults to the largest attempt stored; `success_rule` is the rule the store was collected
    under (config.collect.success). Raises StoreError for a store with no records, or with a
    programmatic verdict that `success_rule` would not give."""
    check_success_rule(success_rule, "success_rule")
    groups = store.groups()
    if not groups:
        raise StoreError(f"the trajectory store at {store.directory} holds no trajectories to report on")
    trajectories = [t for group in groups.values() for t in group]
    check_store_success_rule(trajectories, success_rule, store.directory)
    k_max = max(t.attempt for t in trajectories)
    k = max(attempts or k_max, k_max)
    n = len(groups)
    solved_at = {a: 0 for a in range(1, k + 1)}
    first_steps, retried_steps, retried_first_steps = [], [], []
    by_task: dict[str, dict[str, int]] = {}
    for (task_id, _), group in sorted(groups.items()):
        win = next((t for t in group if t.success), None)
        row = by_task.setdefault(task_id, {"groups": 0, "solved_at_1": 0, "solved": 0, "attempts": 0,
                                           "rewards": []})
        row["groups"] += 1
        row["attempts"] += len(group)
        row["rewards"] += [t.reward for t in group if t.reward is not None]
        if win is None:
            continue
        solved_at[win.attempt] += 1
        row["solved"] += 1
        if win.attempt == 1:
            row["solved_at_1"] += 1
            first_steps.append(win.num_steps)
        else:
            retried_steps.append(win.num_steps)
            retried_first_steps.append(group[0].num_steps)
    for row in by_task.values():
        rewards = row.pop("rewards")
        row["mean_raw_reward"] = _mean(rewards)
        row["partial_rewards"] = sum(0 < r and not is_solved(r) for r in rewards)
    cumulative, total = [], 0
    for a in range(1, k + 1):
        total += solved_at[a]
        cumulative.append(round(total / n, 4))
    success_1, success_k = cumulative[0], cumulative[-1]
    judged = [t for t in trajectories if t.verdict.judge != FAULT_JUDGE]
    return {
        "retry_mode": store.retry_mode,
        "success_rule": success_rule,
        "success_rule_meaning": SUCCESS_RULES[success_rule],
        "tasks": n,
        "attempts_k": k,
        "trajectories": len(trajectories),
        "steps": sum(t.num_steps for t in trajectories),
        "solved_first": solved_at[1],
        "solved": sum(solved_at.values()),
        "solved_at_attempt": {str(a): c for a, c in solved_at.items()},
        "success_at_1": success_1,
        "success_at_le_k": {str(a): c for a, c in zip(range(1, k + 1), cumulative)},
        "success_at_le_K": success_k,
        "yield_gain": round(success_k - success_1, 4),
        "yield_ratio": round(success_k / success_1, 4) if success_1 else None,
        "mean_steps_solved_first_attempt": _mean(first_steps),
        "mean_steps_solved_retried": _mean(retried_steps),
        "mean_steps_failed_first_attempt_of_retried": _mean(retried_first_steps),
        "mean_attempts_per_task": round(len(trajectories) / n, 4),
        "raw_reward": _raw_rewards(trajectories),
        "browser_faults": {
            "faults": sum(len(t.faults) for t in trajectories),
            "attempts_rerun": sum(bool(t.faults) for t in judged),
            "attempts_lost": len(trajectories) - len(judged),
        },
        "judge": {
            "verdicts": len(judged),
            "endpoint_calls": sum(t.verdict.calls for t in judged),
            "errors": sum(t.verdict.outcome == "error" for t in judged),
            "names": sorted({t.verdict.judge for t in judged}),
        },
        "policy": {
            "names": sorted({t.policy for t in trajectories}),
            "steps_acted": sum(t.num_steps for t in trajectories),
            "reflections_written": sum(len(group[-1].reflections) for group in groups.values()),
            "parse_errors": sum(t.parse_errors for t in trajectories),
            "prompt_tokens": sum(t.prompt_tokens for t in trajectories),
            "completion_tokens": sum(t.completion_tokens for t in trajectories),
        },
        "episode_wall_s": round(sum(t.wall_s for t in trajectories), 2),
        "by_task": by_task,
    }


def write_report(store_dir: str | os.PathLike, out_dir: str | os.PathLike, attempts: int | None = None, *,
                 success_rule: str, name: str = "report", extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Returns the report of the store at `store_dir` (collected under `success_rule`), written to
    out_dir/<name>.json, .md and .png. `extra` (e.g. this run's wall time) is added under "run" in
    the JSON only."""
    out_dir = storage.as_path(out_dir)  # local, or gs://
    out_dir.mkdir(parents=True, exist_ok=True)
    with TrajectoryStore(store_dir) as store:
        report = compute_report(store, attempts, success_rule=success_rule)
    report["store"] = str(storage.as_path(store_dir))
    if extra:
        report["run"] = extra
    storage.write_text_atomic(out_dir / f"{name}.json", json.dumps(report, indent=2))
    storage.write_text_atomic(out_dir / f"{name}.md", render_markdown(report))
    storage.write_png(out_dir / f"{name}.png", render_plot(report))
    return report


def _pct(value: float | None) -> str:
    return "—" if value is None else f"{100 * value:.1f}%"


def _num(value: float | None) -> str:
    return "—" if value is None else f"{value:g}"


def _retry_mode(mode: str | None) -> str:
    if mode is None:
        return "not recorded (a store from before collect.retry_mode: reflection-conditioned retries)"
    return f"{mode} ({RETRY_MODE_MEANINGS[mode]})"


def render_markdown(report: dict[str, Any]) -> str:
    """Returns the report as markdown (summary table, success by attempt budget, per task)."""
    k = report["attempts_k"]
    policy, judge, faults, raw = report["policy"], report["judge"], report["browser_faults"], report["raw_reward"]
    lines = [
        "# Collection report", "",
        f"Store `{report.get('store', '')}`: {report['tasks']} task groups, {report['trajectories']} attempts, "
        f"{report['steps']} steps. Policy: {', '.join(policy['names'])}; judge: {', '.join(judge['names']) or '—'}.",
        "", "| figure | value |", "|---|---|",
        f"| retry mode | {_retry_mode(report['retry_mode'])} |",
        f"| success rule | {report['success_rule']} ({report['success_rule_meaning']}) |",
        f"| success@1 | {_pct(report['success_at_1'])} ({report['solved_first']}/{report['tasks']}) |",
        f"| success@≤{k} | {_pct(report['success_at_le_K'])} ({report['solved']}/{report['tasks']}) |",
        f"| yield gain | {100 * report['yield_gain']:+.1f} points (×{_num(report['yield_ratio'])}) |",
        f"| mean steps, solved on attempt 1 | {_num(report['mean_steps_solved_first_attempt'])} |",
        f"| mean steps, solved on a retry | {_num(report['mean_steps_solved_retried'])} |",
        f"| mean steps, failed first attempt of those | {_num(report['mean_steps_failed_first_attempt_of_retried'])} |",
        f"| mean attempts per task | {report['mean_attempts_per_task']:g} |",
        f"| mean raw reward, all attempts / attempt 1 | {_num(raw['mean'])} / {_num(raw['mean_first_attempt'])} |",
        f"| attempts with a partial raw reward (0 < r < 1) | {raw['partial']} of {raw['attempts_with_reward']} |",
        f"| judge verdicts / endpoint calls / errors | {judge['verdicts']} / {judge['endpoint_calls']} / "
        f"{judge['errors']} |",
        f"| browser faults / attempts rerun after them (not retries) / attempts lost to them | "
        f"{faults['faults']} / {faults['attempts_rerun']} / {faults['attempts_lost']} |",
        f"| policy steps / reflections / parse errors | {policy['steps_acted']} / {policy['reflections_written']} / "
        f"{policy['parse_errors']} |",
        f"| policy tokens (prompt / completion) | {policy['prompt_tokens']} / {policy['completion_tokens']} |",
        "", "The step figures compare different subsets of tasks (those solved on attempt 1 against those solved "
        "only on a retry, which tend to be the harder ones), so their difference is not the effect of retrying; "
        "the eval stage compares steps on episodes both policies solved.",
        "", "## Success by attempt budget", "", "| attempts ≤ | success | newly solved |", "|---|---|---|",
    ]
    for a, value in report["success_at_le_k"].items():
        lines.append(f"| {a} | {_pct(value)} | {report['solved_at_attempt'][a]} |")
    lines += ["", "## Per task", "", "| task | groups | solved@1 | solved@≤K | attempts | mean raw reward | partial |",
              "|---|---|---|---|---|---|---|"]
    for task_id, row in report["by_task"].items():
        lines.append(f"| {task_id} | {row['groups']} | {row['solved_at_1']} | {row['solved']} | {row['attempts']} | "
                     f"{_num(row['mean_raw_reward'])} | {row['partial_rewards']} |")
    return "\n".join(lines) + "\n"


def render_plot(report: dict[str, Any], size: tuple[int, int] = (840, 360)) -> Image.Image:
    """Returns a two-panel bar chart: success@<=k per attempt budget k, and mean steps of
    first-attempt successes, retried successes and the failed first attempts of the latter."""
    width, height = size
    img = Image.new("RGB", size, "white")
    draw = ImageDraw.Draw(img)
    half = width // 2
    _bars(draw, (40, 40, half - 20, height - 50), "success@<=k (%)",
          [(f"k={a}", 100 * v) for a, v in report["success_at_le_k"].items()], 100.0, (52, 110, 190))
    steps = [("solved 1st try", report["mean_steps_solved_first_attempt"]),
             ("solved on retry", report["mean_steps_solved_retried"]),
             ("its failed 1st try", report["mean_steps_failed_first_attempt_of_retried"])]
    top = max([v for _, v in steps if v is not None], default=1.0) or 1.0
    _bars(draw, (half + 40, 40, width - 20, height - 50), "mean steps per attempt", steps, top * 1.15, (70, 150, 90))
    return img


def _bars(draw: ImageDraw.ImageDraw, box: tuple[int, int, int, int], title: str,
          bars: list[tuple[str, float | None]], top: float, color: tuple[int, int, int]) -> None:
    x0, y0, x1, y1 = box
    draw.text((x0, y0 - 28), title, fill="black")
    draw.line([(x0, y0), (x0, y1), (x1, y1)], fill="black")
    slot = (x1 - x0) / max(len(bars), 1)
    for i, (label, value) in enumerate(bars):
        left = x0 + i * slot + slot * 0.2
        right = x0 + (i + 1) * slot - slot * 0.2
        draw.text((left, y1 + 6), label, fill="black")
        if value is None:
            draw.text((left, y1 - 16), "n/a", fill="gray")
            continue
        bar_top = min(y1 - (y1 - y0) * min(value / top, 1.0), y1 - 1)  # a zero still shows as a line
        draw.rectangle([left, bar_top, right, y1 - 1], fill=color)
        draw.text((left, bar_top - 14), f"{value:.1f}", fill="black")
