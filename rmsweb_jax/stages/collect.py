"""The `collect` stage: reflection-conditioned retries into the trajectory store, then the report.

    python -m rmsweb_jax.main --config=configs/demo.py --config.stages=collect --workdir=/tmp/run

Reads config.collect (see configs/common.py). Writes workdir/store (or collect.store_dir) and
workdir/collect_report.{json,md,png}. Rerunning with the same store resumes: task groups
already committed are skipped, so a killed run loses at most the groups still in flight.
"""
from __future__ import annotations

import os
import pathlib

from absl import logging

from rmsweb_jax.collect.report import write_report
from rmsweb_jax.collect.retries import RetryCollector
from rmsweb_jax.collect.store import StoreWriter
from rmsweb_jax.suites.task import Task
from rmsweb_jax.web.worker import WorkerConfig

REPORT_NAME = "collect_report"
SUITES = ("miniwob",)


def _endpoint(spec: str, what: str) -> tuple[str, str]:
    # "<base_url>#<model>": the model name cannot contain "#", a URL rarely does.
    base_url, sep, model = spec.rpartition("#")
    if not sep or not base_url or not model:
        raise ValueError(f"{what} {spec!r}: expected '<base_url>#<model>', e.g. 'http://127.0.0.1:8000/v1#qwen3-vl'")
    return base_url, model


def _api_key(cfg) -> str | None:
    name = cfg.get("api_key_env", "")
    if not name:
        return None
    if name not in os.environ:
        raise ValueError(f"collect.api_key_env names ${name}, which is not set")
    return os.environ[name]


def _prompt_builder(config):
    from rmsweb_jax.agents.prompt import PromptBuilder, PromptConfig
    section = config.get("prompt")
    return PromptBuilder(PromptConfig.from_config(section) if section is not None else PromptConfig())


def make_policy(config, workdir: pathlib.Path, task_ids: list[str]):
    """Returns the Policy named by config.collect.policy: "teacher" (ScriptedTeacher with
    collect.teacher's mistakes), "flax:<model spec>" (our model in-process, e.g. flax:random:tiny
    or flax:hf:/ckpt) or "http:<base_url>#<model>" (an OpenAI-compatible endpoint)."""
    cfg = config.collect
    spec = cfg.policy
    if spec == "teacher":
        from rmsweb_jax.agents.teacher import MistakeConfig, ScriptedTeacher
        mistakes = MistakeConfig.from_dict(dict(cfg.teacher.to_dict()))
        return ScriptedTeacher(mistakes, tasks=task_ids)
    kind, _, rest = spec.partition(":")
    if kind == "flax" and rest:
        from rmsweb_jax.agents.chat_model import ChatModel
        from rmsweb_jax.agents.flax_policy import FlaxPolicy
        from rmsweb_jax.sampling.sampler import SamplingParams
        chat_model = ChatModel.load(rest, workdir, config=config, max_batch=cfg.workers)
        params = SamplingParams(max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature)
        return FlaxPolicy(chat_model, _prompt_builder(config), params, seed=config.seed, owns_model=True)
    if kind == "http" and rest:
        from rmsweb_jax.agents.chat_client import ChatClient
        from rmsweb_jax.agents.http_policy import HttpPolicy
        base_url, model = _endpoint(rest, "collect.policy")
        client = ChatClient(base_url, model, api_key=_api_key(cfg), max_concurrency=cfg.workers)
        return HttpPolicy(client, _prompt_builder(config), max_tokens=cfg.max_new_tokens, temperature=cfg.temperature)
    raise ValueError(f"collect.policy {spec!r}: expected 'teacher', 'flax:<model spec>' or 'http:<base_url>#<model>'")


def make_judge(cfg):
    """Returns the judge named by collect.judge: "programmatic", or "<llm judge>:<base_url>#<model>"
    for webvoyager / webjudge / webtailbench."""
    from rmsweb_jax.judges import LLM_JUDGES, chat_from_client
    from rmsweb_jax.judges import make_judge as build
    name, _, rest = cfg.judge.partition(":")
    if name in LLM_JUDGES:
        from rmsweb_jax.agents.chat_client import ChatClient
        base_url, model = _endpoint(rest, "collect.judge")
        return build(name, chat_from_client(ChatClient(base_url, model, api_key=_api_key(cfg))))
    if rest:
        raise ValueError(f"collect.judge {cfg.judge!r}: the {name!r} judge takes no endpoint")
    return build(name)


def miniwob_tasks(cfg) -> list[Task]:
    """Returns the MiniWoB++ tasks of collect.tasks (comma-separated; "" = every task type the
    scripted teacher solves), taken from collect.task_list (a miniwob_tasks.csv) when set."""
    from rmsweb_jax.suites.miniwob import load_miniwob_tasks, miniwob_html_dir
    names = [n.strip() for n in cfg.tasks.split(",") if n.strip()] if cfg.tasks else []
    if not names:
        if cfg.policy != "teacher":
            raise ValueError("collect.tasks is empty: name the task ids (comma-separated) for a model policy")
        from rmsweb_jax.agents.teacher import SOLVED_TASKS
        names = list(SOLVED_TASKS)
    names = [n if n.startswith("miniwob.") else f"miniwob.{n}" for n in names]
    if cfg.task_list:
        known = {t.id: t for t in load_miniwob_tasks(cfg.task_list)}
        unknown = [n for n in names if n not in known]
        if unknown:
            raise ValueError(f"collect.tasks {unknown} are not in collect.task_list {cfg.task_list}")
        return [known[n] for n in names]
    html = miniwob_html_dir()
    tasks = []
    for name in names:
        page = f"miniwob/{name.split('.', 1)[1]}.html"
        if not (html / page).is_file():
            raise ValueError(f"collect.tasks: MiniWoB++ task {name!r} has no page {html / page}")
        tasks.append(Task(suite="miniwob", id=name, start_url=page, site="miniwob"))
    return tasks


def run(config, workdir: pathlib.Path) -> dict:
    """Collects config.collect's tasks × seeds with up to K attempts each into the store, then
    writes workdir/collect_report.{json,md,png}; returns the report."""
    cfg = config.collect
    if cfg.suite not in SUITES:
        raise ValueError(f"collect.suite {cfg.suite!r}: the collect stage runs {list(SUITES)} (live suites need "
                         "the open web and an LLM judge; not wired in yet)")
    from rmsweb_jax.suites.miniwob import MiniWoBSuite
    workdir = pathlib.Path(workdir)
    store_dir = pathlib.Path(cfg.store_dir) if cfg.store_dir else workdir / "store"
    tasks = miniwob_tasks(cfg)
    seeds = list(range(cfg.first_seed, cfg.first_seed + cfg.num_seeds))
    judge = make_judge(cfg)
    policy = make_policy(config, workdir, [t.id for t in tasks])
    if cfg.policy == "teacher":
        print("[collect] policy: ScriptedTeacher, a scripted stand-in for an LLM collector (its rates are no result)")
    print(f"[collect] {len(tasks)} tasks x {len(seeds)} seeds, K={cfg.attempts} attempts, {cfg.workers} workers, "
          f"judge {judge.name}, store {store_dir}")
    writer = dict(flush_every_tasks=cfg.flush_every_tasks, flush_every_s=cfg.flush_every_s)
    try:
        with MiniWoBSuite(episode_time_limit_s=cfg.episode_time_limit_s or None) as suite, \
                StoreWriter(store_dir, **writer) as store:
            if store.removed_orphans:
                logging.info("collect: removed leftovers of an interrupted flush: %s", store.removed_orphans)
            collector = RetryCollector(
                suite, policy, judge, store, attempts=cfg.attempts, workers=cfg.workers, max_steps=cfg.max_steps,
                worker_config=WorkerConfig(step_timeout_s=cfg.step_timeout_s), batch_window_s=cfg.batch_window_s,
                progress=cfg.progress)
            summary = collector.run(tasks, seeds)
    finally:
        policy.close()
    report = write_report(store_dir, workdir, attempts=cfg.attempts, name=REPORT_NAME, extra=summary.to_dict())
    k = report["attempts_k"]
    print(f"[collect] this run: {summary.collected} task groups collected, {summary.skipped} already in the store, "
          f"{summary.steps} steps in {summary.wall_s:.1f} s (mean policy batch {summary.bridge['mean_batch']})")
    print(f"[collect] store: {report['tasks']} task groups, {report['trajectories']} attempts; success@1 "
          f"{100 * report['success_at_1']:.1f}% -> success@<={k} {100 * report['success_at_le_K']:.1f}% "
          f"({100 * report['yield_gain']:+.1f} points)")
    print(f"[collect] mean steps: solved on attempt 1 {report['mean_steps_solved_first_attempt']}, solved on a retry "
          f"{report['mean_steps_solved_retried']} (their failed attempt 1: "
          f"{report['mean_steps_failed_first_attempt_of_retried']}); report {workdir / (REPORT_NAME + '.md')}")
    return report
