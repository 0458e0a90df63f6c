"""Episodes/s of the eval stage with the scripted teacher vs the bare environment loop, on the same
MiniWoB++ tasks and seeds.

  stage  rmsweb_jax.stages.eval.run: the teacher through RetryCollector (policy bridge, judge, store
         flushes), then the report (figures, bootstrap, markdown, PNG) and the trajectory viewer
  bare   our browser pool (AsyncWorkerPool + MiniWoBSuite) asking the same ScriptedTeacher (same
         mistakes, same request ids, so the same episodes) for each action: no store, judge, report

Both sides pay their browser start (and the stage its MiniWoB++ server) inside the timing; each
stage run gets a fresh workdir (a rerun would resume and play nothing). Runs alternate, so load
drifts hit both alike; the best run of each side is reported. Ends with one JSON line (goal: the
stage at >= 0.8x of the bare loop).

    .venv/bin/python bench/eval_throughput.py            # 6 tasks x 8 seeds, 3 runs each
    .venv/bin/python bench/eval_throughput.py --quick    # under a minute
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import os
import pathlib
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("JAX_PLATFORMS", "cpu")

from bench.report import emit  # noqa: E402
from configs.common import base_config  # noqa: E402
from rmsweb_jax.agents.policy import StepContext  # noqa: E402
from rmsweb_jax.agents.teacher import MistakeConfig, ScriptedTeacher  # noqa: E402
from rmsweb_jax.collect.records import request_id  # noqa: E402
from rmsweb_jax.stages import eval as eval_stage  # noqa: E402
from rmsweb_jax.stages.collect import collect_tasks  # noqa: E402
from rmsweb_jax.suites.from_config import suite_from_config  # noqa: E402
from rmsweb_jax.web.actions import Action  # noqa: E402
from rmsweb_jax.web.episode import EpisodeRequest  # noqa: E402
from rmsweb_jax.web.pool import AsyncWorkerPool  # noqa: E402
from rmsweb_jax.web.worker import WorkerConfig  # noqa: E402

TASKS = "click-test,enter-text,click-dialog,login-user,click-button,click-checkboxes"  # 1-4 steps each


def cpu_model() -> str:
    """Returns lscpu's model name and whether AVX-512 is there (figures differ by machine type)."""
    info = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    name = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("Model name")), "?")
    return f"{name} ({'AVX-512' if 'avx512f' in info else 'no AVX-512'}, {os.cpu_count()} cores)"


def bench_config(tasks: str, seeds: int, workers: int, max_steps: int, viewer: bool):
    """Returns the config the stage runs: the teacher alone, seeds 1000.., no training-store check."""
    c = base_config()
    c.collect.tasks = tasks
    c.collect.workers = workers
    c.collect.progress = False
    c.eval.policies = "teacher"
    c.eval.first_seed = 1000
    c.eval.num_seeds = seeds
    c.eval.max_steps = max_steps
    c.eval.training_store = "none"
    c.eval.viewer = viewer
    return c


def run_stage(config) -> tuple[int, int, float, dict]:
    """Returns (episodes, steps, wall seconds, the stage's own split of them) of one eval stage run in a
    fresh workdir."""
    with tempfile.TemporaryDirectory() as workdir, contextlib.redirect_stdout(io.StringIO()):
        started = time.perf_counter()
        report = eval_stage.run(config, pathlib.Path(workdir))
        wall = time.perf_counter() - started
    overall = report["policies"][0]["overall"]
    return overall["episodes"], round(overall["cost"]["policy_calls"] * overall["episodes"]), wall, report["seconds"]


async def _bare(config) -> tuple[int, int, float]:
    env = config.collect
    tasks = collect_tasks(env)
    seeds = range(config.eval.first_seed, config.eval.first_seed + config.eval.num_seeds)
    teacher = ScriptedTeacher(MistakeConfig.from_dict(dict(env.teacher.to_dict())), tasks=[t.id for t in tasks])

    async def policy(history) -> Action:
        rid, step = history.request.request_id, len(history.actions)
        ctx = StepContext(task_id=history.request.task.id, instruction=history.instruction,
                          observation=history.observation, step=step, key=f"{rid}/{step}")
        return teacher.act([ctx])[0].action or Action("wait", seconds=0.0)

    requests = [EpisodeRequest(task=t, seed=s, max_steps=config.eval.max_steps, request_id=request_id(t.id, s, 1))
                for t in tasks for s in seeds]
    started = time.perf_counter()
    with suite_from_config(env) as suite:
        async with AsyncWorkerPool(suite, env.workers, WorkerConfig(step_timeout_s=env.step_timeout_s),
                                   max_attempts=env.pool_max_attempts) as pool:
            episodes = [e async for e in pool.run(requests, policy)]
    wall = time.perf_counter() - started
    lost = [e.request.request_id for e in episodes if not e.complete]
    if lost:
        raise RuntimeError(f"bare loop: episodes lost to browser faults: {lost}")
    return len(episodes), sum(len(e.actions) for e in episodes), wall


def run_bare(config) -> tuple[int, int, float, dict]:
    """Returns (episodes, steps, wall seconds, {}) of the bare loop over the stage's tasks and seeds."""
    return (*asyncio.run(_bare(config)), {})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="finish within a minute")
    parser.add_argument("--tasks", default=None, help=f"comma-separated MiniWoB++ tasks (default {TASKS})")
    parser.add_argument("--seeds", type=int, default=None, help="seeds per task")
    parser.add_argument("--repeats", type=int, default=None, help="runs per side, alternating; the best is reported")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--max-steps", type=int, default=15)
    parser.add_argument("--no-viewer", action="store_true", help="the stage without its trajectory viewer")
    args = parser.parse_args()
    tasks = args.tasks or (",".join(TASKS.split(",")[:4]) if args.quick else TASKS)
    seeds = args.seeds or (3 if args.quick else 8)
    repeats = args.repeats or (1 if args.quick else 3)
    config = bench_config(tasks, seeds, args.workers, args.max_steps, viewer=not args.no_viewer)
    print(f"cpu: {cpu_model()}; {len(tasks.split(','))} tasks x {seeds} seeds, {args.workers} workers, "
          f"max {args.max_steps} steps, viewer {'on' if config.eval.viewer else 'off'}", flush=True)
    best = {"stage": 0.0, "bare": 0.0}
    steps = {}
    for i in range(repeats):
        for side, runner in (("bare", run_bare), ("stage", run_stage)):
            episodes, n_steps, wall, split = runner(config)
            best[side] = max(best[side], episodes / wall)
            steps.setdefault(side, n_steps)
            print(f"run {i + 1} {side:5s}: {episodes} episodes, {n_steps} steps in {wall:.2f} s = "
                  f"{episodes / wall:.2f} episodes/s" + (f" (stage's split {split})" if split else ""), flush=True)
    if steps["stage"] != steps["bare"]:
        print(f"note: the two sides took different step counts ({steps}): a page or the teacher differed")
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    emit("eval_stage_episodes_per_s[teacher, miniwob] vs bare pool loop", best["stage"], best["bare"], "episodes/s",
         0.8, steps=steps, cpu=cpu_model())


if __name__ == "__main__":
    main()
