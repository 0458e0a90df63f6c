"""A config.collect-shaped block's suite and tasks: `suite_from_config`, `miniwob_tasks`, `live_tasks`.

Here, beside the suites, rather than in the collect stage: collect, eval and mine play the same suites
from the same keys (collect.suite, task_list, tasks, limit, viewport, extra_hosts, ...), and eval
passes its own copy of the block (eval.tasks for collect.tasks)."""
from __future__ import annotations

import contextlib
from typing import Sequence

from rmsweb_jax import storage
from rmsweb_jax.errors import UserError
from rmsweb_jax.suites import load_online_mind2web, load_webtailbench, load_webvoyager
from rmsweb_jax.suites.download import default_task_file, download_command
from rmsweb_jax.suites.live import LiveSuite
from rmsweb_jax.suites.miniwob import MiniWoBSuite, load_miniwob_tasks, miniwob_html_dir
from rmsweb_jax.suites.task import Task

SUITES = ("miniwob", "webvoyager", "online_mind2web", "webtailbench")
LIVE_SUITES = ("webvoyager", "online_mind2web", "webtailbench")


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


def miniwob_tasks(cfg, default_tasks: Sequence[str] = ()) -> list[Task]:
    """Returns the MiniWoB++ tasks of collect.tasks (comma-separated; "" = `default_tasks`, e.g. every task
    type the scripted teacher solves when it plays), taken from collect.task_list (a miniwob_tasks.csv) when
    set. The caller passes the defaults: suites/ knows no policy."""
    names = [n.strip() for n in cfg.tasks.split(",") if n.strip()] if cfg.tasks else []
    if not names:
        if not default_tasks:
            raise UserError("collect.tasks is empty: name the task ids (comma-separated) for a model policy")
        names = list(default_tasks)
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


def suite_from_config(cfg):
    """Returns the suite of collect.suite as a context manager: MiniWoBSuite (serves its pages)
    or LiveSuite (collect.viewport, allowlists widened by collect.extra_hosts)."""
    if cfg.suite == "miniwob":
        return MiniWoBSuite(episode_time_limit_s=cfg.episode_time_limit_s or None)
    viewport = tuple(int(v) for v in cfg.viewport)
    if len(viewport) != 2 or min(viewport) < 64:
        raise UserError(f"collect.viewport must be (width, height) of at least 64 px each, got {cfg.viewport!r}")
    hosts = tuple(h.strip() for h in cfg.extra_hosts.split(",") if h.strip())
    return contextlib.nullcontext(LiveSuite(viewport=viewport, extra_hosts=hosts))
