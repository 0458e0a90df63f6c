"""Episodes/s recording every episode (HAR with bodies, clock, storage) and replaying it offline vs playing
plainly: the browser pool on a small live-style site (a fresh context per episode, as live suites play),
and the eval stage on MiniWoB++ with the scripted teacher.

  live    AsyncWorkerPool + LiveSuite on a local site (pages, script, image, fetch), a scripted policy
          (follow a link, answer): plain vs WorkerConfig.tape record vs replay (the site down)

  eval    rmsweb_jax.stages.eval.run on MiniWoB++:
  plain   as it is (one page kept across episodes: MiniWoB++'s fast path, which recording gives up)
  record  the same with collect.record=har: a fresh context per episode recorded as a HAR with bodies,
          the clock fixed, storage saved, the HAR hashed into the store
  replay  eval.replay of the record run's store: every request served from the HARs, nothing from the
          MiniWoB++ server

Each run gets a fresh workdir (a rerun would resume and play nothing); the sides alternate, so load
drifts hit all alike; the best run of each side is reported. Prints every ratio and ends with one
JSON line for recording vs plain on the live site (goal: >= 0.8x), the other ratios beside it.

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
from rmsweb_jax.suites.http_server import LocalHTTPServer  # noqa: E402
from rmsweb_jax.suites.live import LiveSuite  # noqa: E402
from rmsweb_jax.suites.task import Task  # noqa: E402
from rmsweb_jax.web.actions import RELATIVE, Action  # noqa: E402
from rmsweb_jax.web.episode import EpisodeRequest  # noqa: E402
from rmsweb_jax.web.loop_thread import run_sync  # noqa: E402
from rmsweb_jax.web.pool import AsyncWorkerPool  # noqa: E402
from rmsweb_jax.web.recording import RECORD, REPLAY, Tape  # noqa: E402
from rmsweb_jax.web.worker import WorkerConfig  # noqa: E402

TASKS = "click-test,enter-text,click-dialog,login-user"  # 1-4 steps each


def run_eval(config, workdir: pathlib.Path) -> tuple[int, int, float]:
    """Returns (episodes counted, episodes off their recording, wall seconds) of one eval stage run."""
    with contextlib.redirect_stdout(io.StringIO()):
        started = time.perf_counter()
        report = eval_stage.run(config, workdir)
        wall = time.perf_counter() - started
    overall = report["policies"][0]["overall"]
    return overall["episodes"], overall["off_record"], wall


SITE = {
    "index.html": """<!doctype html><html><head><title>Shop</title><script src="app.js"></script></head><body>
<h1>Shop</h1><img src="logo.svg" width="120" height="40" alt="logo"><p id="n"></p>
<a href="item.html" style="display:block;font-size:40px">Blue Widget</a></body></html>""",
    "item.html": """<!doctype html><html><head><title>Item</title><script src="app.js"></script></head><body>
<h1>Blue Widget</h1><img src="logo.svg" width="120" height="40" alt="logo"><p>Price: $42</p><p id="n"></p>
</body></html>""",
    "app.js": "fetch('stock.json').then(r => r.json()).then(d => { document.getElementById('n').textContent ="
              " 'in stock: ' + d.n; });\n" + "// padding, as real scripts are\n" * 2000,
    "stock.json": '{"n": 7}',
    "logo.svg": '<svg xmlns="http://www.w3.org/2000/svg" width="120" height="40"><rect width="120" height="40" '
                'fill="#36c"/></svg>',
}


def site_policy(history) -> Action:
    """Follows the link on the index page, answers on the item page."""
    obs = history.observation
    if obs.title == "Shop":
        link = next((e for e in obs.elements if e.role == "link"), None)
        if link is not None:
            return Action.click(*RELATIVE.from_css(link.bbox.center, obs.viewport))
    return Action.answer_with("$42") if obs.title == "Item" else Action("wait", seconds=0.1)


def run_live(tapes: pathlib.Path, side: str, site_dir: pathlib.Path, episodes: int, workers: int) -> tuple[int, int, float]:
    """Returns (episodes complete, episodes off their recording, wall seconds) of the pool on the site."""
    tape = None if side == "plain" else Tape(RECORD if side == "record" else REPLAY, str(tapes))
    server = LocalHTTPServer(site_dir, port=_PORT[0])
    _PORT[0] = server.port  # the same origin every run: the replay's recordings name it
    if side == "replay":
        server.close()  # offline: the site is down
    task = Task(suite="bench", id="shop", start_url=f"http://127.0.0.1:{_PORT[0]}/index.html", instruction="price?",
                allowed_hosts=(f"127.0.0.1:{_PORT[0]}",))

    async def go():
        async with AsyncWorkerPool(LiveSuite(viewport=(640, 400), settle_s=0.05), workers,
                                   WorkerConfig(tape=tape)) as pool:
            return [e async for e in pool.run([EpisodeRequest(task, seed=s, max_steps=6) for s in range(episodes)],
                                              site_policy)]
    try:
        started = time.perf_counter()
        done = run_sync(go())
        wall = time.perf_counter() - started
    finally:
        if side != "replay":
            server.close()
    complete = [e for e in done if e.complete and e.actions and e.actions[-1].name == "answer"]
    return len(complete), sum(e.off_record is not None for e in done), wall


_PORT = [0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="finish within a minute")
    parser.add_argument("--seeds", type=int, default=None, help="seeds per task")
    parser.add_argument("--repeats", type=int, default=None, help="runs per side, alternating; the best is reported")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    tasks = ",".join(TASKS.split(",")[:2]) if args.quick else TASKS
    seeds = args.seeds or (2 if args.quick else 6)
    repeats = args.repeats or (1 if args.quick else 3)
    print(f"cpu: {cpu_model()}; {len(tasks.split(','))} tasks x {seeds} seeds, {args.workers} workers", flush=True)
    live_episodes = 6 if args.quick else 16
    best_live = {"plain": 0.0, "record": 0.0, "replay": 0.0}
    for i in range(repeats):
        root = pathlib.Path(tempfile.mkdtemp(prefix="record_replay-live-"))
        try:
            (root / "site").mkdir()
            for name, text in SITE.items():
                (root / "site" / name).write_text(text)
            for side in ("plain", "record", "replay"):
                episodes, off, wall = run_live(root / "tapes", side, root / "site", live_episodes, args.workers)
                best_live[side] = max(best_live[side], (episodes + off) / wall)
                print(f"run {i + 1} live {side:6s}: {episodes} episodes answered (+{off} off record) in {wall:.2f} s "
                      f"= {(episodes + off) / wall:.2f} episodes/s", flush=True)
        finally:
            shutil.rmtree(root, ignore_errors=True)
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
                print(f"run {i + 1} eval {side:6s}: {episodes} episodes (+{off} off record) in {wall:.2f} s = "
                      f"{(episodes + off) / wall:.2f} episodes/s", flush=True)
        finally:
            shutil.rmtree(root, ignore_errors=True)
    live = {k: best_live[k] / best_live["plain"] for k in ("record", "replay")}
    miniwob = {k: best[k] / best["plain"] for k in ("record", "replay")}
    print(f"live site: record / plain {live['record']:.3f}x, replay / plain {live['replay']:.3f}x; MiniWoB++ eval: "
          f"record / plain {miniwob['record']:.3f}x, replay / plain {miniwob['replay']:.3f}x (its kept page given up); "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    emit("live_pool_record_har_episodes_per_s vs plain", best_live["record"], best_live["plain"], "episodes/s", 0.8,
         replay_ratio=round(live["replay"], 3), miniwob_eval_record_ratio=round(miniwob["record"], 3),
         miniwob_eval_replay_ratio=round(miniwob["replay"], 3), cpu=cpu_model())


if __name__ == "__main__":
    main()
