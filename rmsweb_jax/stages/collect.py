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
judge over an OpenAI-compatible endpoint — by default the benchmark's official one (OFFICIAL_JUDGES;
collect.judge = "<base_url>#<model>"), or another named ("webjudge:<base_url>#<model>"). The
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

import contextlib
import dataclasses
import os
import pathlib

from absl import logging

from rmsweb_jax import storage
from rmsweb_jax.collect.report import check_store_success_rule, write_report
from rmsweb_jax.collect.retries import RetryCollector
from rmsweb_jax.collect.store import RETRY_MODES, StoreWriter
from rmsweb_jax.collect.store_provenance import policy_provenance
from rmsweb_jax.errors import UserError
from rmsweb_jax.stages.manifest import MODEL_LOADING
from rmsweb_jax.suites.success_rule import check_success_rule
from rmsweb_jax.suites.task import Task
from rmsweb_jax.web.worker import WorkerConfig

# What the stage reads and writes (rmsweb_jax/stages/manifest.py decides from these whether it is up to date).
# A flax: policy loads its own spec (model.init is not read) with the run's dtypes, mesh and seed.
CONFIG_READS = ("collect", "prompt", *MODEL_LOADING, "seed")
INPUT_STAGES: dict = {}
OUTPUTS = {"store": "collect.store_dir", "collect_report.json": None, "collect_viewer": None}

REPORT_NAME = "collect_report"
VIEWER_DIR = "collect_viewer"  # collect.viewer: the static HTML viewer over the store
SUITES = ("miniwob", "webvoyager", "online_mind2web", "webtailbench")
LIVE_SUITES = ("webvoyager", "online_mind2web", "webtailbench")
# The judge each benchmark's published numbers use; collect.judge = "<base_url>#<model>" picks it.
OFFICIAL_JUDGES = {"miniwob": "programmatic", "webvoyager": "webvoyager", "online_mind2web": "webjudge",
                   "webtailbench": "webtailbench"}


def _endpoint(spec: str, what: str) -> tuple[str, str]:
    # "<base_url>#<model>": the model name cannot contain "#", a URL rarely does.
    base_url, sep, model = spec.rpartition("#")
    if not sep or not base_url or not model:
        raise UserError(f"{what} {spec!r}: expected '<base_url>#<model>', e.g. 'http://127.0.0.1:8000/v1#qwen3-vl'")
    return base_url, model


def _api_key(name: str, key: str) -> str | None:
    # `name` is the env var that config key `key` names ("" = no key).
    if not name:
        return None
    if name not in os.environ:
        raise UserError(f"{key} names ${name}, which is not set")
    return os.environ[name]


def _prompt_builder(config):
    from rmsweb_jax.agents.prompt import PromptBuilder, prompt_config_from
    return PromptBuilder(prompt_config_from(config))


@dataclasses.dataclass(frozen=True)
class PolicySettings:
    """What building a policy takes besides its spec: the suite it plays, the model's batch size,
    its sampling, the teacher's mistakes (MistakeConfig fields), the env var holding an endpoint's
    API key, and the config key that named the spec (for error messages)."""

    suite: str
    max_batch: int
    max_new_tokens: int
    temperature: float
    teacher: dict
    api_key_env: str
    key: str


def collect_policy_settings(config) -> PolicySettings:
    """Returns the PolicySettings of config.collect (the collecting policy)."""
    cfg = config.collect
    return PolicySettings(suite=cfg.suite, max_batch=cfg.workers, max_new_tokens=cfg.max_new_tokens,
                          temperature=cfg.temperature, teacher=dict(cfg.teacher.to_dict()),
                          api_key_env=cfg.api_key_env, key="collect.policy")


def build_policy(spec: str, settings: PolicySettings, *, config, workdir: pathlib.Path, task_ids: list[str],
                 devices=None):
    """Returns the Policy of `spec`: "teacher" (ScriptedTeacher with settings.teacher's mistakes),
    "flax:<model spec>" (our model in-process, e.g. flax:random:tiny or flax:hf:/ckpt, with the
    run's config for dtypes, mesh and prompt) or "http:<base_url>#<model>" (an OpenAI-compatible
    endpoint). A flax model is placed on `devices` (default: the global mesh's): jax.local_devices() when each
    host plays its own episodes, sampling at its own browsers' pace. Raises UserError naming settings.key for
    an unknown spec or a teacher on a live suite."""
    if spec == "teacher" and settings.suite != "miniwob":
        raise UserError(f"{settings.key} 'teacher' cannot play the {settings.suite} suite: the ScriptedTeacher only "
                        "knows MiniWoB++; use 'http:<base_url>#<model>' or 'flax:<model spec>'")
    if spec == "teacher":
        from rmsweb_jax.agents.teacher import MistakeConfig, ScriptedTeacher
        return ScriptedTeacher(MistakeConfig.from_dict(settings.teacher), tasks=task_ids)
    kind, _, rest = spec.partition(":")
    if kind == "flax" and rest:
        from rmsweb_jax.sampling.chat_model import ChatModel
        from rmsweb_jax.agents.flax_policy import FlaxPolicy
        from rmsweb_jax.sampling.sampler import SamplingParams
        chat_model = ChatModel.load(rest, workdir, config=config, max_batch=settings.max_batch, devices=devices)
        params = SamplingParams(max_new_tokens=settings.max_new_tokens, temperature=settings.temperature)
        return FlaxPolicy(chat_model, _prompt_builder(config), params, seed=config.seed, owns_model=True)
    if kind == "http" and rest:
        from rmsweb_jax.agents.chat_client import ChatClient
        from rmsweb_jax.agents.http_policy import HttpPolicy
        base_url, model = _endpoint(rest, settings.key)
        api_key = _api_key(settings.api_key_env, "collect.api_key_env")
        client = ChatClient(base_url, model, api_key=api_key, max_concurrency=settings.max_batch)
        return HttpPolicy(client, _prompt_builder(config), max_tokens=settings.max_new_tokens,
                          temperature=settings.temperature)
    raise UserError(f"{settings.key} {spec!r}: expected 'teacher', 'flax:<model spec>' or 'http:<base_url>#<model>'")


def make_policy(config, workdir: pathlib.Path, task_ids: list[str]):
    """Returns the Policy named by config.collect.policy (see build_policy)."""
    return build_policy(config.collect.policy, collect_policy_settings(config), config=config, workdir=workdir,
                        task_ids=task_ids)


def judge_spec(cfg) -> tuple[str, str | None]:
    """Returns (judge name, "<base_url>#<model>" or None) of collect.judge for collect.suite:
    "" is the suite's official judge (an LLM judge then needs an endpoint), "<base_url>#<model>"
    the official judge on that endpoint, "<name>" or "<name>:<base_url>#<model>" a judge by name.
    Raises UserError for the programmatic judge on a live suite and for a missing endpoint."""
    from rmsweb_jax.judges import JUDGES, LLM_JUDGES
    suite, spec = cfg.suite, cfg.judge.strip()
    if suite not in OFFICIAL_JUDGES:
        raise UserError(f"collect.suite {suite!r}: expected one of {list(SUITES)}")
    official = OFFICIAL_JUDGES[suite]
    if spec.startswith(("http://", "https://")):
        if official not in LLM_JUDGES:
            raise UserError(f"collect.judge {spec!r}: the {suite} suite's own judge is {official!r}, which takes no "
                            "endpoint; to judge it with an LLM name one: '<judge>:<base_url>#<model>' with <judge> "
                            f"in {list(LLM_JUDGES)}")
        name, endpoint = official, spec
    else:
        name, _, endpoint = (spec or official).partition(":")
    if name not in JUDGES:
        raise UserError(f"collect.judge {cfg.judge!r}: unknown judge {name!r}; expected '<base_url>#<model>' (the "
                        f"{suite} suite's {official!r} judge) or one of {sorted(JUDGES)}")
    if suite in LIVE_SUITES and name not in LLM_JUDGES:
        raise UserError(f"collect.judge {name!r} cannot judge the live {suite} suite: live sites report no reward; "
                        f"use an LLM judge, the benchmark's official one is {official!r} "
                        f"(collect.judge='<base_url>#<model>' or '{official}:<base_url>#<model>')")
    if name in LLM_JUDGES:
        if not endpoint:
            raise UserError(f"collect.judge {cfg.judge!r}: the {name!r} judge is an LLM judge and needs its endpoint: "
                            f"'{name}:<base_url>#<model>' (or '<base_url>#<model>' for the {suite} suite's official "
                            f"{official!r} judge), e.g. '{name}:http://127.0.0.1:8001/v1#qwen3-vl-32b'")
        _endpoint(endpoint, "collect.judge")
        return name, endpoint
    if endpoint:
        raise UserError(f"collect.judge {cfg.judge!r}: the {name!r} judge takes no endpoint")
    return name, None


def make_judge(cfg):
    """Returns the judge of collect.judge (see judge_spec): the programmatic one under
    collect.success, or an LLM judge over its endpoint, with collect.judge_api_key_env's key and
    collect.judge_screenshots as its screenshot budget."""
    from rmsweb_jax.judges import chat_from_client
    from rmsweb_jax.judges import make_judge as build
    name, endpoint = judge_spec(cfg)
    if endpoint is None:  # the programmatic judge: the reward under collect.success decides
        return build(name, success=check_success_rule(cfg.success, "collect.success"))
    from rmsweb_jax.agents.chat_client import ChatClient
    base_url, model = _endpoint(endpoint, "collect.judge")
    options = {}
    shots = cfg.judge_screenshots
    if shots:  # WebJudge keeps up to this many relevant screenshots; the others attach the last this many
        options["max_images" if name == "webjudge" else "max_screenshots"] = int(shots)
    api_key = _api_key(cfg.judge_api_key_env, "collect.judge_api_key_env")
    client = ChatClient(base_url, model, api_key=api_key, max_concurrency=max(cfg.workers, 8))
    return build(name, chat_from_client(client), **options)


def _limit(cfg) -> int:
    limit = cfg.limit
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
        raise UserError(f"collect.limit must be an int >= 0 (0 = every selected task), got {limit!r}")
    return limit


def select_tasks(tasks: list[Task], cfg, source: str) -> list[Task]:
    """Returns the tasks named by collect.tasks (comma-separated ids, in that order; "" = all of
    them), at most collect.limit of them (0 = no limit). Raises UserError naming unknown ids."""
    limit = _limit(cfg)
    names = [n.strip() for n in cfg.tasks.split(",") if n.strip()] if cfg.tasks else []
    if names:
        known = {t.id: t for t in tasks}
        unknown = [n for n in names if n not in known]
        if unknown:
            sample = ", ".join(list(known)[:3])
            raise UserError(f"collect.tasks {unknown} are not in {source} (its ids look like: {sample}, ...)")
        tasks = [known[n] for n in dict.fromkeys(names)]
    return tasks[:limit] if limit else tasks


def live_tasks(cfg) -> list[Task]:
    """Returns the live suite's tasks: collect.task_list (empty: the suite's downloaded file in the
    default data dir, see rmsweb_jax/suites/download.py) read by the suite's loader (WebVoyager
    joined with collect.reference_answers when set), selected by collect.tasks / collect.limit."""
    from rmsweb_jax.suites import load_online_mind2web, load_webtailbench, load_webvoyager
    from rmsweb_jax.suites.download import default_task_file, download_command
    if not cfg.task_list:
        path = default_task_file(cfg.suite)
        if not path.is_file():
            raise UserError(f"collect.task_list is empty and the {cfg.suite} task file is not in the default data "
                            f"dir ({path}; $RMSWEB_DATA sets the dir): download it with "
                            f"`{download_command(cfg.suite)}`, or name a task file with --config.collect.task_list")
        print(f"[collect] collect.task_list is empty: reading {path}")
    else:
        path = storage.pull_file(cfg.task_list)  # a gs:// task file is read from its local mirror
        if not path.is_file():
            raise UserError(f"collect.task_list {cfg.task_list!r}: no such file (the {cfg.suite} task file; "
                            f"`{download_command(cfg.suite)}` downloads the official ones)")
    references = cfg.reference_answers
    if references and cfg.suite != "webvoyager":
        raise UserError(f"collect.reference_answers is WebVoyager's reference_answer.json; the {cfg.suite} suite "
                        "has none")
    if cfg.suite == "webvoyager":
        tasks = load_webvoyager(path, storage.pull_file(references) if references else None)
    elif cfg.suite == "online_mind2web":
        tasks = load_online_mind2web(path)
    else:
        tasks = load_webtailbench(path)
    tasks = select_tasks(tasks, cfg, str(path))
    if not tasks:
        raise UserError(f"collect.task_list {str(path)!r} holds no tasks")
    return tasks


def miniwob_tasks(cfg) -> list[Task]:
    """Returns the MiniWoB++ tasks of collect.tasks (comma-separated; "" = every task type the
    scripted teacher solves), taken from collect.task_list (a miniwob_tasks.csv) when set."""
    from rmsweb_jax.suites.miniwob import load_miniwob_tasks, miniwob_html_dir
    names = [n.strip() for n in cfg.tasks.split(",") if n.strip()] if cfg.tasks else []
    if not names:
        if cfg.policy != "teacher":
            raise UserError("collect.tasks is empty: name the task ids (comma-separated) for a model policy")
        from rmsweb_jax.agents.teacher import SOLVED_TASKS
        names = list(SOLVED_TASKS)
    names = [n if n.startswith("miniwob.") else f"miniwob.{n}" for n in names]
    limit = _limit(cfg)
    names = names[:limit] if limit else names
    if cfg.task_list:
        known = {t.id: t for t in load_miniwob_tasks(cfg.task_list)}
        unknown = [n for n in names if n not in known]
        if unknown:
            raise UserError(f"collect.tasks {unknown} are not in collect.task_list {cfg.task_list}")
        return [known[n] for n in names]
    html = miniwob_html_dir()
    tasks = []
    for name in names:
        page = f"miniwob/{name.split('.', 1)[1]}.html"
        if not (html / page).is_file():
            raise UserError(f"collect.tasks: MiniWoB++ task {name!r} has no page {html / page}")
        tasks.append(Task(suite="miniwob", id=name, start_url=page, site="miniwob"))
    return tasks


def make_suite(cfg):
    """Returns the suite of collect.suite as a context manager: MiniWoBSuite (serves its pages)
    or LiveSuite (collect.viewport, allowlists widened by collect.extra_hosts)."""
    if cfg.suite == "miniwob":
        from rmsweb_jax.suites.miniwob import MiniWoBSuite
        return MiniWoBSuite(episode_time_limit_s=cfg.episode_time_limit_s or None)
    from rmsweb_jax.suites.live import LiveSuite
    viewport = tuple(int(v) for v in cfg.viewport)
    if len(viewport) != 2 or min(viewport) < 64:
        raise UserError(f"collect.viewport must be (width, height) of at least 64 px each, got {cfg.viewport!r}")
    hosts = tuple(h.strip() for h in cfg.extra_hosts.split(",") if h.strip())
    return contextlib.nullcontext(LiveSuite(viewport=viewport, extra_hosts=hosts))


def _check_judge_fits(judge_name: str, tasks: list[Task], cfg) -> None:
    # Caught here, not as one judge error per attempt after the browsers ran.
    if judge_name == "webtailbench":
        bare = [t.id for t in tasks if not t.rubric]
        if bare:
            raise UserError(f"collect.judge webtailbench needs each task's rubric; {len(bare)} task(s) of "
                            f"collect.task_list {cfg.task_list!r} have none (e.g. {bare[0]!r}): use the Stagehand "
                            "form of the file (precomputed_rubric.items), or another judge")


def run(config, workdir: pathlib.Path) -> dict:
    """Collects config.collect's tasks × seeds with up to K attempts each into the store, then
    writes workdir/collect_report.{json,md,png}; returns the report."""
    cfg = config.collect
    if cfg.suite not in SUITES:
        raise UserError(f"collect.suite {cfg.suite!r}: expected one of {list(SUITES)}")
    workdir = storage.as_path(workdir)  # local, or gs:// (the store then lives in a local mirror, see store.py)
    store_dir = storage.as_path(cfg.store_dir) if cfg.store_dir else workdir / "store"
    judge_name, _ = judge_spec(cfg)  # a wrong judge fails before any task file is read or model loaded
    check_success_rule(cfg.success, "collect.success")  # the report names it for every judge
    if cfg.retry_mode not in RETRY_MODES:
        raise UserError(f"collect.retry_mode {cfg.retry_mode!r}: expected 'reflection' (retries conditioned on the "
                        "policy's reflections) or 'plain' (retries without them, a fresh draw each)")
    if cfg.policy == "teacher" and cfg.suite != "miniwob":
        make_policy(config, workdir, [])  # raises: the teacher only knows MiniWoB++
    tasks = miniwob_tasks(cfg) if cfg.suite == "miniwob" else live_tasks(cfg)
    seeds = list(range(cfg.first_seed, cfg.first_seed + cfg.num_seeds))
    judge = make_judge(cfg)
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
        with make_suite(cfg) as suite, StoreWriter(store_dir, **writer) as store:
            # Before any browser starts: a store of the other rule would mix two meanings of success.
            check_store_success_rule(store.trajectories(), cfg.success, store_dir)
            if store.removed_orphans:
                logging.info("collect: removed leftovers of an interrupted flush: %s", store.removed_orphans)
            collector = RetryCollector(
                suite, policy, judge, store, attempts=cfg.attempts, workers=cfg.workers, max_steps=cfg.max_steps,
                worker_config=WorkerConfig(step_timeout_s=cfg.step_timeout_s), batch_window_s=cfg.batch_window_s,
                pool_max_attempts=cfg.pool_max_attempts, fault_reruns=cfg.fault_reruns, progress=cfg.progress,
                retry_mode=cfg.retry_mode)
            summary = collector.run(tasks, seeds)
    finally:
        policy.close()
    report = write_report(store_dir, workdir, attempts=cfg.attempts, success_rule=cfg.success, name=REPORT_NAME,
                          extra=summary.to_dict())
    k = report["attempts_k"]
    print(f"[collect] this run: {summary.collected} task groups collected, {summary.skipped} already in the store, "
          f"{summary.steps} steps in {summary.wall_s:.1f} s (mean policy batch {summary.bridge['mean_batch']})")
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
