"""The closed-loop mode of `action_accuracy`: the SFT policy plays held-out MiniWoB++ seeds in the browser.

    python -m rmsweb_jax.main --config=configs/demo.py --config.stages=action_accuracy --workdir=/tmp/run \
        --config.action_accuracy.mode=closed_loop

The checkpoint (config.action_accuracy.checkpoint, default hf:<workdir>/sft/hf) runs as a
FlaxPolicy (greedy, config.action_accuracy.max_new_tokens, the shared prompt builder) through the
collection machinery itself (RetryCollector, one attempt, so no reflection) on the task types of
config.collect.tasks x the seeds action_accuracy.closed_loop.first_seed .. + num_seeds - 1. Those
seeds must be disjoint from every seed the sft stage trained on (its <workdir>/sft/split.json):
a seed seen in training is an error, not a figure. Success is *solved* (raw reward >= 1 - 1e-6).
Episodes go to <workdir>/closed_loop/<checkpoint name>/store (a rerun with the same checkpoint
resumes there); the figures — success per task with a 95% Wilson interval, and overall — to
<workdir>/closed_loop.{json,md}.
"""
from __future__ import annotations

import collections
import json
import math
import pathlib
import time

from rmsweb_jax.errors import UserError

REPORT = "closed_loop"
Z95 = 1.959963984540054


def wilson_interval(successes: int, n: int, z: float = Z95) -> tuple[float, float]:
    """Returns the Wilson score interval (low, high) of a binomial proportion; (0, 1) for n = 0."""
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def trained_groups(workdir: pathlib.Path) -> set[tuple[str, int]]:
    """Returns the (task id, seed) groups the sft stage split (trained on or held out), from its split.json."""
    from rmsweb_jax.stages.sft import split_path
    path = split_path(workdir)
    if not path.is_file():
        raise UserError(f"{path}: no split; closed-loop evaluation checks its seeds against the seeds sft trained "
                        "on: run the sft stage with this workdir first")
    saved = json.loads(path.read_text())
    return {(str(t), int(s)) for t, s in saved["train_task_groups"] + saved["held_out_task_groups"]}


def check_disjoint(task_ids: list[str], seeds: list[int], trained: set[tuple[str, int]]) -> None:
    """Raises UserError naming a (task, seed) the closed-loop run would play that sft trained on."""
    seen = sorted((t, s) for t in task_ids for s in seeds if (t, s) in trained)
    if seen:
        raise UserError(f"action_accuracy.closed_loop seeds overlap the seeds sft trained on: {seen[:3]} "
                        f"({len(seen)} task groups); set closed_loop.first_seed past the collected seeds "
                        "(collect.first_seed + collect.num_seeds)")


def summarize(groups: dict[tuple[str, int], list]) -> dict:
    """Returns per-task and overall success (solved on the one attempt) with 95% Wilson intervals."""
    by_task: dict[str, dict] = collections.defaultdict(lambda: {"episodes": 0, "solved": 0, "steps": 0,
                                                                "parse_errors": 0, "end_reasons": collections.Counter()})
    for (task_id, _), attempts in sorted(groups.items()):
        t = attempts[0]
        row = by_task[task_id]
        row["episodes"] += 1
        row["solved"] += bool(t.success)
        row["steps"] += t.num_steps
        row["parse_errors"] += t.parse_errors
        row["end_reasons"][t.end_reason or t.status] += 1
    tasks = {}
    for task_id, row in sorted(by_task.items()):
        low, high = wilson_interval(row["solved"], row["episodes"])
        tasks[task_id] = {"episodes": row["episodes"], "solved": row["solved"],
                          "success": row["solved"] / row["episodes"], "ci95": [round(low, 3), round(high, 3)],
                          "mean_steps": round(row["steps"] / row["episodes"], 2), "parse_errors": row["parse_errors"],
                          "end_reasons": dict(row["end_reasons"])}
    n, k = sum(r["episodes"] for r in tasks.values()), sum(r["solved"] for r in tasks.values())
    low, high = wilson_interval(k, n)
    return {"episodes": n, "solved": k, "success": k / n if n else 0.0, "ci95": [round(low, 3), round(high, 3)],
            "tasks": tasks}


def markdown(report: dict) -> str:
    """Returns the report as a markdown table (one row per task, then the total)."""
    lines = [f"# Closed-loop success of {report['checkpoint']}", "",
             f"Held-out seeds {report['seeds'][0]}..{report['seeds'][1]} (disjoint from sft's), one attempt, greedy, "
             f"success = solved. {report['seconds']} s.", "",
             "| task | solved / episodes | success | 95% CI (Wilson) | mean steps | parse errors |",
             "|---|---|---|---|---|---|"]
    rows = list(report["tasks"].items()) + [("**all**", report)]
    for name, r in rows:
        lines.append(f"| {name} | {r['solved']} / {r['episodes']} | {100 * r['success']:.1f}% | "
                     f"{100 * r['ci95'][0]:.1f}-{100 * r['ci95'][1]:.1f}% | {r.get('mean_steps', '')} | "
                     f"{r.get('parse_errors', '')} |")
    return "\n".join(lines) + "\n"


def run(config, workdir: pathlib.Path) -> dict:
    """Plays the held-out seeds with the checkpoint; writes workdir/closed_loop.{json,md} and returns the report."""
    from rmsweb_jax.stages.collect import miniwob_tasks
    cl, collect = config.action_accuracy.closed_loop, config.collect
    workdir = pathlib.Path(workdir)
    if collect.suite != "miniwob":
        raise UserError(f"action_accuracy.mode 'closed_loop' plays seeded MiniWoB++ tasks; collect.suite is "
                        f"{collect.suite!r} (live sites cannot be held out by seed)")
    if not collect.tasks:
        raise UserError("action_accuracy.mode 'closed_loop' plays the task types of collect.tasks, which is empty")
    for key in ("num_seeds", "max_steps"):
        if isinstance(cl[key], bool) or not isinstance(cl[key], int) or cl[key] < 1:
            raise UserError(f"action_accuracy.closed_loop.{key} must be an int >= 1, got {cl[key]!r}")
    tasks = miniwob_tasks(collect)
    seeds = list(range(cl.first_seed, cl.first_seed + cl.num_seeds))
    check_disjoint([t.id for t in tasks], seeds, trained_groups(workdir))
    report = play(config, workdir, tasks, seeds)
    (workdir / f"{REPORT}.json").write_text(json.dumps(report, indent=2))
    (workdir / f"{REPORT}.md").write_text(markdown(report))
    for task_id, r in report["tasks"].items():
        print(f"[action_accuracy] {task_id}: {r['solved']}/{r['episodes']} = {100 * r['success']:.1f}% "
              f"(95% CI {100 * r['ci95'][0]:.1f}-{100 * r['ci95'][1]:.1f}%)")
    print(f"[action_accuracy] closed-loop success {report['solved']}/{report['episodes']} = "
          f"{100 * report['success']:.1f}% (95% CI {100 * report['ci95'][0]:.1f}-{100 * report['ci95'][1]:.1f}%) on "
          f"held-out seeds; report {workdir / (REPORT + '.md')}")
    return report


def play(config, workdir: pathlib.Path, tasks: list, seeds: list[int]) -> dict:
    """Returns the figures (summarize) of the checkpoint playing tasks x seeds, one greedy attempt each,
    through the collection machinery; the seeds are not checked here (run does)."""
    from rmsweb_jax.agents.flax_policy import FlaxPolicy
    from rmsweb_jax.agents.prompt import PromptBuilder, prompt_config_from
    from rmsweb_jax.collect.retries import RetryCollector
    from rmsweb_jax.collect.store import StoreWriter, TrajectoryStore
    from rmsweb_jax.collect.store_provenance import policy_provenance
    from rmsweb_jax.judges import make_judge
    from rmsweb_jax.sampling.chat_model import ChatModel
    from rmsweb_jax.sampling.sampler import SamplingParams
    from rmsweb_jax.stages.collect import make_suite
    from rmsweb_jax.suites.success_rule import check_success_rule
    from rmsweb_jax.web.worker import WorkerConfig

    cfg, cl, collect = config.action_accuracy, config.action_accuracy.closed_loop, config.collect
    workdir = pathlib.Path(workdir)
    spec = cfg.checkpoint or f"hf:{workdir / 'sft' / 'hf'}"
    if spec.startswith("hf:") and not (pathlib.Path(spec[3:]).expanduser() / "config.json").is_file():
        raise UserError(f"config.action_accuracy.checkpoint {spec!r}: no HF checkpoint there (run the sft "
                        "stage with config.train.export_hf=True first, or point it at hf:/path)")
    chat_model = ChatModel.load(spec, workdir, config=config, max_batch=cfg.batch_size)
    policy = FlaxPolicy(chat_model, PromptBuilder(prompt_config_from(config)),
                        SamplingParams(max_new_tokens=cfg.max_new_tokens, temperature=0.0), seed=config.seed,
                        owns_model=True)
    judge = make_judge("programmatic", success=check_success_rule("solved", "closed-loop success"))
    store_dir = workdir / REPORT / chat_model.name.replace("@", "_")
    print(f"[action_accuracy] closed loop: {spec} on {len(tasks)} task types x seeds {seeds[0]}..{seeds[-1]}, "
          f"1 attempt, {collect.workers} browsers; episodes in {store_dir}")
    start = time.time()
    try:
        with make_suite(collect) as suite, StoreWriter(store_dir, flush_every_tasks=collect.flush_every_tasks,
                                                       flush_every_s=collect.flush_every_s, policy=policy.name,
                                                       provenance=policy_provenance(policy)) as store:
            RetryCollector(suite, policy, judge, store, attempts=1, workers=collect.workers, max_steps=cl.max_steps,
                           worker_config=WorkerConfig(step_timeout_s=collect.step_timeout_s),
                           batch_window_s=collect.batch_window_s, pool_max_attempts=collect.pool_max_attempts,
                           fault_reruns=collect.fault_reruns, progress=collect.progress).run(tasks, seeds)
        stats = policy.stats()
    finally:
        policy.close()
    wanted = {(t.id, s) for t in tasks for s in seeds}
    groups = {k: v for k, v in TrajectoryStore(store_dir).groups().items() if k in wanted}
    return {"checkpoint": spec, "seeds": [seeds[0], seeds[-1]], "max_steps": cl.max_steps,
            "max_new_tokens": cfg.max_new_tokens, **summarize(groups), "policy_stats": stats,
            "store_dir": str(store_dir), "seconds": round(time.time() - start, 1)}
