"""Env steps/s on MiniWoB++: our worker pool vs a bare Playwright loop vs BrowserGym.

A step is one action plus a full observation (screenshot, element list, done flag); the wall
time covers the whole plan, resets included. All three run the same episodes (bench/env_plan.py:
same tasks, seeds and click points) with 1, 2 and 4 workers:

  ours        AsyncWorkerPool + MiniWoBSuite (records, allowlist, semantic targets, fault handling)
  bare        a bare Playwright loop doing the same click + screenshot + element list (the ceiling)
  browsergym  browsergym-miniwob 0.14.3 (one process per worker; its own venv under .bench_venvs/,
              its "downloaded" Chromium a wrapper around Debian's)

Prints a table, then one JSON line comparing ours with the bare loop at 2 workers.

    .venv/bin/python bench/env_steps.py            # full run (installs BrowserGym's venv if missing)
    .venv/bin/python bench/env_steps.py --quick    # about a minute; BrowserGym (1 worker) only if installed
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import pathlib
import subprocess
import sys
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.env_bare_loop import run_bare_loop  # noqa: E402
from bench.report import emit  # noqa: E402
from bench.env_plan import MAX_STEPS, click_point, episode_plan, warmup_plan  # noqa: E402
from rmsweb_jax.suites.miniwob import MiniWoBSuite  # noqa: E402
from rmsweb_jax.suites.task import Task  # noqa: E402
from rmsweb_jax.web.actions import RELATIVE, Action  # noqa: E402
from rmsweb_jax.web.browser import CHROMIUM_FLAGS, find_chromium  # noqa: E402
from rmsweb_jax.web.episode import EpisodeRequest  # noqa: E402
from rmsweb_jax.web.pool import AsyncWorkerPool  # noqa: E402

BG_VENV = REPO / ".bench_venvs" / "browsergym"
BG_BROWSERS = REPO / ".bench_venvs" / "pw-browsers"
BG_PACKAGE = "browsergym-miniwob==0.14.3"
HEADLINE_WORKERS = 2


def _requests(plan, max_steps: int = MAX_STEPS) -> list[EpisodeRequest]:
    return [EpisodeRequest(Task(suite="miniwob", id=f"miniwob.{task}", start_url=f"miniwob/{task}.html"),
                           seed=seed, max_steps=max_steps, request_id=str(index)) for index, task, seed in plan]


async def run_ours(suite: MiniWoBSuite, workers: int, plan, warmup=()) -> tuple[int, float]:
    """Returns (steps, wall seconds) for the plan on an AsyncWorkerPool (browser start and the
    `warmup` plan, one step per episode, untimed)."""

    async def policy(history):
        point = click_point(int(history.request.request_id), len(history.actions))
        return Action.click(*RELATIVE.from_css(point, history.observation.viewport))

    async with AsyncWorkerPool(suite, workers) as pool:
        _ = [e async for e in pool.run(_requests(warmup, max_steps=1), policy)]
        started = time.perf_counter()
        episodes = [e async for e in pool.run(_requests(plan), policy)]
        wall = time.perf_counter() - started
    bad = [e.request.request_id for e in episodes if not e.complete]
    if bad:
        raise RuntimeError(f"episodes failed: {bad}")
    return sum(len(e.actions) for e in episodes), wall


def ensure_browsergym(install: bool) -> pathlib.Path | None:
    """Returns the BrowserGym venv's python (creating the venv when `install`), or None."""
    python = BG_VENV / "bin" / "python"
    ok = python.exists() and subprocess.run([str(python), "-c", "import browsergym.miniwob"],
                                            capture_output=True).returncode == 0
    if not ok and install:
        print(f"installing {BG_PACKAGE} into {BG_VENV} ...", flush=True)
        base = getattr(sys, "_base_executable", sys.executable)
        subprocess.run([base, "-m", "venv", str(BG_VENV)], check=True)
        subprocess.run([str(BG_VENV / "bin" / "pip"), "install", "-q", BG_PACKAGE], check=True)
        ok = True
    return python if ok else None


def browsergym_browsers(python: pathlib.Path) -> pathlib.Path:
    """Returns a PLAYWRIGHT_BROWSERS_PATH whose expected chromium-NNNN/chrome-linux/chrome (for the
    venv's Playwright) is a wrapper exec'ing Debian's Chromium with our flags."""
    revision = subprocess.run(
        [str(python), "-c", "import json, pathlib, playwright; p = pathlib.Path(playwright.__file__).parent / "
         "'driver/package/browsers.json'; print(next(b['revision'] for b in json.loads(p.read_text())['browsers'] "
         "if b['name'] == 'chromium'))"], capture_output=True, text=True, check=True).stdout.strip()
    chrome = BG_BROWSERS / f"chromium-{revision}" / "chrome-linux" / "chrome"
    chrome.parent.mkdir(parents=True, exist_ok=True)
    chrome.write_text(f'#!/bin/sh\nexec {find_chromium()} {" ".join(CHROMIUM_FLAGS)} "$@"\n')
    chrome.chmod(0o755)
    return BG_BROWSERS


def run_browsergym(python: pathlib.Path, miniwob_url: str, workers: int, per_worker: int) -> tuple[int, float]:
    """Returns (steps, wall seconds) for `workers` BrowserGym processes running side by side."""
    env = {**os.environ, "PLAYWRIGHT_BROWSERS_PATH": str(browsergym_browsers(python))}
    procs = [subprocess.Popen([str(python), str(REPO / "bench" / "env_browsergym.py"), "--miniwob-url", miniwob_url,
                               "--first", str(i * per_worker), "--count", str(per_worker)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for i in range(workers)]
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=900)
        if proc.returncode != 0:
            raise RuntimeError(f"BrowserGym run failed:\n{err[-2000:]}")
        results.append(json.loads(out.strip().splitlines()[-1]))
    # Each process times itself after its imports; they run side by side.
    return sum(r["steps"] for r in results), max(r["wall_s"] for r in results)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="finish within a minute")
    parser.add_argument("--workers", default="1,2,4")
    parser.add_argument("--episodes", type=int, default=None, help="episodes per run (ours and bare)")
    parser.add_argument("--repeats", type=int, default=None, help="runs per setting; the best is reported")
    parser.add_argument("--no-browsergym", action="store_true")
    args = parser.parse_args()
    workers_list = [int(w) for w in args.workers.split(",")]
    if args.quick:
        workers_list = [w for w in workers_list if w <= 2]
    episodes = args.episodes or (8 if args.quick else 48)
    repeats = args.repeats or (1 if args.quick else 2)
    plan = episode_plan(episodes)
    warmup_for = {w: warmup_plan(w) for w in workers_list}

    python = None if args.no_browsergym else ensure_browsergym(install=not args.quick)
    if python is None and not args.no_browsergym:
        print(f"BrowserGym skipped: --quick does not install {BG_PACKAGE} (run once without --quick)")

    rows = {}
    with MiniWoBSuite() as suite:
        for workers in workers_list:
            bare, ours = 0.0, 0.0
            for _ in range(repeats):  # interleaved, so load from other processes hits both alike
                # Every browser sees every task page before the clock starts: steady-state
                # throughput, not first page loads (which a long collection run pays once).
                warmup = warmup_for[workers]
                steps, wall = asyncio.run(run_bare_loop(suite.base_url, workers, plan, warmup=warmup))
                bare = max(bare, steps / wall)
                steps, wall = asyncio.run(run_ours(suite, workers, plan, warmup=warmup))
                ours = max(ours, steps / wall)
            bg = None
            if python is not None and (not args.quick or workers == 1):
                per_worker = 2 if args.quick else 8
                steps, wall = run_browsergym(python, suite.base_url + "miniwob/", workers, per_worker)
                bg = steps / wall
            rows[workers] = (bare, ours, bg)
            print(f"workers={workers}: bare {bare:6.1f} steps/s | ours {ours:6.1f} steps/s "
                  f"({ours / bare:.2f} of bare) | browsergym "
                  + (f"{bg:5.2f} steps/s (ours {ours / bg:.1f}x)" if bg else "not run"), flush=True)

    headline = HEADLINE_WORKERS if HEADLINE_WORKERS in rows else max(rows)
    bare, ours, bg = rows[headline]
    print(f"episodes per run: {episodes} (max {MAX_STEPS} steps), best of {repeats}; "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    emit(f"env_steps_per_s[miniwob, {headline} workers] vs bare playwright loop", ours, bare, "steps/s", 0.8)


if __name__ == "__main__":
    main()
