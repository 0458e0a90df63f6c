"""The `collect` stage: reflection-conditioned retries into the trajectory store, then the report.

    python -m rmsweb_jax.main --config=configs/demo.py --config.stages=collect --workdir=/tmp/run

    # a live benchmark: your task file, your policy endpoint, the benchmark's judge on a VLM endpoint
    python -m rmsweb_jax.main --config=configs/demo.py --config.stages=collect --workdir=/tmp/wv \
        --config.collect.suite=webvoyager --config.collect.task_list=/data/WebVoyager_data.jsonl \
        --config.collect.limit=20 --config.collect.max_steps=30 --config.collect.num_seeds=1 \
        --config.collect.policy=http:http://127.0.0.1:8000/v1#qwen3-vl-8b \
        --config.collect.judge=http://judge.example:8000/v1#qwen3-vl-32b --config.collect.judge_api_key_env=JUDGE_KEY

Suites: `miniwob` (local pages, programmatic judge by default, the ScriptedTeacher may play) and
the live benchmarks `webvoyager`, `online_mind2web`, `webtailbench`: tasks from the benchmark's
task file (collect.task_list; none ships with rmsweb_jax), run on the open web, judged by an LLM
judge over an OpenAI-compatible endpoint — by default the benchmark's official one
(judges/from_config.py OFFICIAL_JUDGES; collect.judge = "<base_url>#<model>"), or another named
("webjudge:<base_url>#<model>"). The
programmatic judge cannot judge a live suite (live sites report no reward) and is refused, as is
the teacher (it only knows MiniWoB++). The reflector is the policy's own `reflect()`. A judge
that cannot decide (endpoint down, unparseable reply) records an error verdict and ends that
task group unsolved, without a reflection (see rmsweb_jax/collect/retries.py); the report counts
judge errors. Such a group is committed like any other, so a rerun over the same store skips it.

Reads config.collect (see configs/common.py). Writes workdir/store (or collect.store_dir),
workdir/collect_report.{json,md,png} and, with collect.viewer, the trajectory viewer
workdir/collect_viewer/index.html (rmsweb_jax/evaluate/viewer.py). Rerunning with the same
store resumes: task groups already committed are skipped, so a killed run loses at most the
groups still in flight.
"""
from __future__ import annotations

import pathlib

from absl import logging

from rmsweb_jax import storage
from rmsweb_jax.agents.from_config import PolicySettings, build_policy
from rmsweb_jax.collect.report import check_store_success_rule, write_report
from rmsweb_jax.collect.retries import CollectSettings, RetryCollector
from rmsweb_jax.collect.store import RETRY_MODES, StoreWriter
from rmsweb_jax.collect.store_provenance import policy_provenance
from rmsweb_jax.errors import UserError
from rmsweb_jax.judges.cache import CACHE_DIR, JudgeCache
from rmsweb_jax.judges.from_config import judge_from_config, judge_spec
from rmsweb_jax.stages.manifest import COLLECT_RUNTIME, MODEL_LOADING
from rmsweb_jax.suites.from_config import LIVE_SUITES, SUITES, live_tasks, miniwob_tasks, suite_from_config
from rmsweb_jax.suites.success_rule import check_success_rule
from rmsweb_jax.suites.task import Task

# What the stage reads and writes (rmsweb_jax/stages/manifest.py decides from these whether it is up to date).
# A flax: policy loads its own spec (model.init is not read) with the run's dtypes, mesh and seed.
CONFIG_READS = ("collect", "web", "prompt", *MODEL_LOADING, "seed")
INPUT_STAGES: dict = {}
OUTPUTS = {"store": "collect.store_dir", "collect_report.json": None, "collect_viewer": None}
NON_RESULT_FIELDS = COLLECT_RUNTIME  # changed alone: a rerun resumes or skips, never afresh (manifest.py)

REPORT_NAME = "collect_report"
VIEWER_DIR = "collect_viewer"  # collect.viewer: the static HTML viewer over the store


def collect_policy_settings(config) -> PolicySettings:
    """Returns the PolicySettings of config.collect (the collecting policy)."""
    cfg = config.collect
    return PolicySettings(suite=cfg.suite, max_batch=cfg.workers, max_new_tokens=cfg.max_new_tokens,
                          temperature=cfg.temperature, teacher=dict(cfg.teacher.to_dict()),
                          api_key_env=cfg.api_key_env, key="collect.policy")


def make_policy(config, workdir: pathlib.Path, task_ids: list[str]):
    """Returns the Policy named by config.collect.policy (see build_policy)."""
    return build_policy(config.collect.policy, collect_policy_settings(config), config=config, workdir=workdir,
                        task_ids=task_ids)


def collect_tasks(cfg) -> list[Task]:
    """Returns collect's tasks: the live suite's (live_tasks), or MiniWoB++'s of collect.tasks, where "" is every
    task type the scripted teacher solves when it plays (a model policy must name them)."""
    if cfg.suite != "miniwob":
        return live_tasks(cfg)
    from rmsweb_jax.agents.teacher import SOLVED_TASKS
    return miniwob_tasks(cfg, SOLVED_TASKS if cfg.policy == "teacher" else ())


def _check_judge_fits(judge_name: str, tasks: list[Task], cfg) -> None:
    # Caught here, not as one judge error per attempt after the browsers ran.
    if judge_name == "webtailbench":
        bare = [t.id for t in tasks if not t.rubric]
        if bare:
            raise UserError(f"collect.judge webtailbench needs each task's rubric; {len(bare)} task(s) of "
                            f"collect.task_list {cfg.task_list!r} have none (e.g. {bare[0]!r}): use the Stagehand "
                            "form of the file (precomputed_rubric.items), or another judge")


def check_config(config, workdir) -> CollectSettings:
    """Returns the retry loop's settings of config.collect once the suite, judge, success rule and policy settings
    check too (no task file, browser or model); raises UserError naming the key. The pipeline calls it before any
    stage runs (stages/pipeline.py check_stages), run() as its first step."""
    cfg = config.collect
    if cfg.suite not in SUITES:
        raise UserError(f"collect.suite {cfg.suite!r}: expected one of {list(SUITES)}")
    judge_spec(cfg)  # a wrong judge fails before any task file is read or model loaded
    check_success_rule(cfg.success, "collect.success")  # the report names it for every judge
    if cfg.retry_mode not in RETRY_MODES:
        raise UserError(f"collect.retry_mode {cfg.retry_mode!r}: expected 'reflection' (retries conditioned on the "
                        "policy's reflections) or 'plain' (retries without them, a fresh draw each)")
    collect_policy_settings(config)
    return CollectSettings.from_config(cfg, config.web)


def run(config, workdir: pathlib.Path) -> dict:
    """Collects config.collect's tasks × seeds with up to K attempts each into the store, then
    writes workdir/collect_report.{json,md,png}; returns the report."""
    cfg = config.collect
    settings = check_config(config, workdir)
    workdir = storage.as_path(workdir)  # local, or gs:// (the store then lives in a local mirror, see store.py)
    store_dir = storage.as_path(cfg.store_dir) if cfg.store_dir else workdir / "store"
    judge_name, _ = judge_spec(cfg)
    if cfg.policy == "teacher" and cfg.suite != "miniwob":
        make_policy(config, workdir, [])  # raises: the teacher only knows MiniWoB++
    tasks = collect_tasks(cfg)
    seeds = list(range(cfg.first_seed, cfg.first_seed + cfg.num_seeds))
    # collect.record: the LLM judge's replies are cached in the store too, so a replay is judged without it
    judge = judge_from_config(cfg, cache=JudgeCache(store_dir / CACHE_DIR) if cfg.record else None)
    _check_judge_fits(judge_name, tasks, cfg)
    policy = make_policy(config, workdir, [t.id for t in tasks])
    if cfg.policy == "teacher":
        print("[collect] policy: ScriptedTeacher, a scripted stand-in for an LLM collector (its rates are no result)")
    if cfg.suite in LIVE_SUITES and len(seeds) > 1:
        print(f"[collect] live sites cannot be seeded: each of the {len(seeds)} seeds is one more independent run")
    print(f"[collect] {len(tasks)} tasks x {len(seeds)} seeds, K={cfg.attempts} attempts ({cfg.retry_mode} "
          f"retries), {cfg.workers} workers, "
          f"judge {judge.name}, store {store_dir}")
    # The store records the policy's name (a checkpoint's own for flax:) and refuses another's.
    writer = dict(flush_every_tasks=cfg.flush_every_tasks, flush_every_s=cfg.flush_every_s, policy=policy.name,
                  provenance=policy_provenance(policy))
    try:
        with suite_from_config(cfg) as suite, StoreWriter(store_dir, **writer) as store:
            # Before any browser starts: a store of the other rule would mix two meanings of success.
            check_store_success_rule(store.trajectories(), cfg.success, store_dir)
            if store.removed_orphans:
                logging.info("collect: removed leftovers of an interrupted flush: %s", store.removed_orphans)
            collector = RetryCollector(suite, policy, judge, store, settings)
            summary = collector.run(tasks, seeds)
    finally:
        policy.close()
    report = write_report(store_dir, workdir, attempts=cfg.attempts, success_rule=cfg.success, name=REPORT_NAME,
                          extra=summary.to_dict())
    k = report["attempts_k"]
    print(f"[collect] this run: {summary.collected} task groups collected, {summary.skipped} already in the store, "
          f"{summary.steps} steps in {summary.wall_s:.1f} s (mean policy batch {summary.bridge['mean_batch']})")
    for endpoint, why in summary.endpoints_down.items():
        print(f"[collect] the remote Chromium at {endpoint} went down for good; its episodes ran on the other "
              f"endpoints ({why})")
    print(f"[collect] store: {report['tasks']} task groups, {report['trajectories']} attempts; success "
          f"({report['success_rule']}: {report['success_rule_meaning']}) @1 "
          f"{100 * report['success_at_1']:.1f}% -> success@<={k} {100 * report['success_at_le_K']:.1f}% "
          f"({100 * report['yield_gain']:+.1f} points); judge {report['judge']['endpoint_calls']} calls, "
          f"{report['judge']['errors']} errors (groups ended unjudged); mean raw reward "
          f"{report['raw_reward']['mean']}, "
          f"{report['raw_reward']['partial']} partial; browser faults {report['browser_faults']['faults']} "
          f"({report['browser_faults']['attempts_rerun']} attempts rerun, {report['browser_faults']['attempts_lost']} "
          "lost)")
    print(f"[collect] mean steps: solved on attempt 1 {report['mean_steps_solved_first_attempt']}, solved on a retry "
          f"{report['mean_steps_solved_retried']} (their failed attempt 1: "
          f"{report['mean_steps_failed_first_attempt_of_retried']}); report {workdir / (REPORT_NAME + '.md')}")
    if cfg.viewer:
        from rmsweb_jax.evaluate.viewer import write_viewer
        index = write_viewer([store_dir], workdir / VIEWER_DIR)
        print(f"[collect] trajectory viewer: {index}")
    return report
