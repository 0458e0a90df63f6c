"""Episodes/s of the eval stage recording every episode (collect.record=har) and replaying them
(eval.replay) vs playing them plainly, on the same MiniWoB++ tasks and seeds with the scripted teacher.

  plain   rmsweb_jax.stages.eval.run as it is (one page kept across episodes: MiniWoB++'s fast path)
  record  the same with collect.record=har: a fresh context per episode recorded as a HAR with bodies,
          the clock fixed, storage saved, the HAR hashed into the store
  replay  eval.replay of the record run's store: every request served from the HARs, nothing from the
          MiniWoB++ server

Each run gets a fresh workdir (a rerun would resume and play nothing); the sides alternate, so load
drifts hit all alike; the best run of each side is reported. Prints both ratios and ends with one
JSON line for recording vs plain (goal: >= 0.8x), replay vs plain beside it.

    .venv/bin/python bench/record_replay.py            # 4 tasks x 6 seeds, 3 runs each
    .venv/bin/python bench/record_replay.py --quick    # under a minute
"""
from __future__ import annotations

import argparse
import contextlib
import io
import os
import pathlib
import shutil
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("JAX_PLATFORMS", "cpu")

from bench.eval_throughput import bench_config, cpu_model  # noqa: E402
from bench.report import emit  # noqa: E402
from rmsweb_jax.stages import eval as eval_stage  # noqa: E402

TASKS = "click-test,enter-text,click-dialog,login-user"  # 1-4 steps each


def run_eval(config, workdir: pathlib.Path) -> tuple[int, int, float]:
    """Returns (episodes counted, episodes off their recording, wall seconds) of one eval stage run."""
    with contextlib.redirect_stdout(io.StringIO()):
        started = time.perf_counter()
        report = eval_stage.run(config, workdir)
        wall = time.perf_counter() - started
    overall = report["policies"][0]["overall"]
    return overall["episodes"], overall["off_record"], wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="finish within a minute")
    parser.add_argument("--seeds", type=int, default=None, help="seeds per task")
    parser.add_argument("--repeats", type=int, default=None, help="runs per side, alternating; the best is reported")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    tasks = ",".join(TASKS.split(",")[:3]) if args.quick else TASKS
    seeds = args.seeds or (2 if args.quick else 6)
    repeats = args.repeats or (1 if args.quick else 3)
    print(f"cpu: {cpu_model()}; {len(tasks.split(','))} tasks x {seeds} seeds, {args.workers} workers", flush=True)
    best = {"plain": 0.0, "record": 0.0, "replay": 0.0}
    for i in range(repeats):
        root = pathlib.Path(tempfile.mkdtemp(prefix="record_replay-"))
        try:
            for side in ("plain", "record", "replay"):
                config = bench_config(tasks, seeds, args.workers, 15, viewer=False)
                if side == "record":
                    config.collect.record = "har"
                if side == "replay":
                    (recorded,) = (root / "record" / "eval").glob("teacher@*/store")
                    config.eval.replay = str(recorded)
                episodes, off, wall = run_eval(config, root / side)
                best[side] = max(best[side], (episodes + off) / wall)
                print(f"run {i + 1} {side:6s}: {episodes} episodes (+{off} off record) in {wall:.2f} s = "
                      f"{(episodes + off) / wall:.2f} episodes/s", flush=True)
        finally:
            shutil.rmtree(root, ignore_errors=True)
    print(f"record / plain {best['record'] / best['plain']:.3f}x; replay / plain {best['replay'] / best['plain']:.3f}x; "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    emit("eval_record_har_episodes_per_s[teacher, miniwob] vs plain eval", best["record"], best["plain"],
         "episodes/s", 0.8, replay_episodes_per_s=round(best["replay"], 2),
         replay_ratio=round(best["replay"] / best["plain"], 3), cpu=cpu_model())


if __name__ == "__main__":
    main()
