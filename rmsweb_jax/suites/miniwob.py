"""MiniWoB++: the task list (our table miniwob_tasks.csv beside this module, checked against the
installed `miniwob` package's pages), and the suite that serves that package's html/ folder on
127.0.0.1 and runs seeded episodes in a worker."""
from __future__ import annotations

import csv
import pathlib
from typing import Any

from rmsweb_jax.suites.http_server import LocalHTTPServer
from rmsweb_jax.suites.success_rule import is_solved
from rmsweb_jax.suites.task_files import TaskFileError
from rmsweb_jax.suites.task import Task
from rmsweb_jax.web.actions import Action
from rmsweb_jax.web.safety import RequestPolicy
from rmsweb_jax.web.suite import EpisodeStatus

# Our table of the 125 tasks BrowserGym runs (its experiments metadata): category, WebGUM subset,
# similarity group, train/test split. Facts about the tasks, shipped as package data.
TASK_TABLE = pathlib.Path(__file__).with_name("miniwob_tasks.csv")
CSV_COLUMNS = ("task_name", "miniwob_category", "comment", "webgum_subset", "similarity_group", "browsergym_split")
# setTimeout's longest delay; larger values fire at once.
NO_TIME_LIMIT_MS = 2**31 - 1
# The HUD to the right of the task shows the last reward and a countdown: hidden from the agent
# unless show_hud (hiding it here costs no extra round trip).
_BEGIN_JS = """([seed, maxTimeMs, mode, showHud]) => {
  for (const id of ['reward-display', 'click-canvas']) {
    const hud = document.getElementById(id);
    if (hud && !showHud) hud.style.display = 'none';
  }
  Math.seedrandom(seed);
  if (mode !== null) core.setDataMode(mode);
  core.EPISODE_MAX_TIME = maxTimeMs;
  core.startEpisodeReal();
  return WOB_TASK_READY === true ? utterance() : null;
}"""
_UTTERANCE_JS = """() => utterance()"""
# getUtterance returns a string, or {utterance, fields} in the tasks that override it.
_UTTERANCE_FN = """function utterance() { const u = core.getUtterance(); return typeof u === 'string' ? u : u.utterance; }"""


def _wrap(function: str) -> str:
    # Evaluate `function` with the utterance helper in scope.
    return f"(arg) => {{ {_UTTERANCE_FN}; return ({function})(arg); }}"


def miniwob_html_dir() -> pathlib.Path:
    """Returns the html/ folder of the installed `miniwob` package."""
    try:  # deferred: an optional package that only MiniWoB++ runs need
        import miniwob
    except ImportError as e:
        raise ImportError("the MiniWoB++ suite needs the `miniwob` package (pip install miniwob)") from e
    path = pathlib.Path(miniwob.__file__).parent / "html"
    if not (path / "miniwob").is_dir():
        raise FileNotFoundError(f"miniwob package at {path.parent} has no html/miniwob/ folder")
    return path


def load_miniwob_tasks(csv_path: str | pathlib.Path | None = None,
                       html_dir: str | pathlib.Path | None = None) -> list[Task]:
    """Returns the MiniWoB++ tasks listed in `csv_path` (default: the packaged TASK_TABLE; columns
    task_name, miniwob_category, comment, webgum_subset, similarity_group, browsergym_split), each
    checked to have its page under `html_dir`/miniwob/ (default: the installed package's).
    Raises TaskFileError naming file and line."""
    html_dir = pathlib.Path(html_dir) if html_dir is not None else miniwob_html_dir()
    csv_path = pathlib.Path(csv_path) if csv_path is not None else TASK_TABLE
    tasks = []
    with csv_path.open(newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        missing = [c for c in CSV_COLUMNS if c not in (reader.fieldnames or ())]
        if missing:
            raise TaskFileError(csv_path, 1, f"missing columns {missing}; expected {list(CSV_COLUMNS)}")
        for row in reader:
            line = reader.line_num
            name = row["task_name"] or ""
            if not name.startswith("miniwob.") or len(name) <= len("miniwob."):
                raise TaskFileError(csv_path, line, f"task_name: expected 'miniwob.<task>', got {name!r}")
            page = f"miniwob/{name.split('.', 1)[1]}.html"
            if not (html_dir / page).is_file():
                raise TaskFileError(csv_path, line, f"task {name!r}: no page {html_dir / page}")
            if row["browsergym_split"] not in ("train", "test"):
                raise TaskFileError(csv_path, line, f"browsergym_split: expected train or test, got {row['browsergym_split']!r}")
            if row["webgum_subset"] not in ("True", "False"):
                raise TaskFileError(csv_path, line, f"webgum_subset: expected True or False, got {row['webgum_subset']!r}")
            try:
                group = int(row["similarity_group"])
            except (TypeError, ValueError):
                raise TaskFileError(csv_path, line, f"similarity_group: expected an integer, got {row['similarity_group']!r}") from None
            tasks.append(Task(suite="miniwob", id=name, start_url=page, site="miniwob", category=row["miniwob_category"],
                              split=row["browsergym_split"],
                              metadata={"webgum_subset": row["webgum_subset"] == "True", "similarity_group": group,
                                        "delay": row["comment"] == "delay"}))
    return tasks


class MiniWoBSuite:
    """Runs MiniWoB++ tasks: serves html/ on 127.0.0.1, reuses one page per worker, starts each
    episode with `Math.seedrandom(seed)` + `core.startEpisodeReal()`, reads the instruction from
    `core.getUtterance()` and the outcome from WOB_DONE_GLOBAL / WOB_RAW_REWARD_GLOBAL.

    `episode_time_limit_s` is MiniWoB's own in-page limit (None: no limit; past it the page
    ends the episode with reward -1). `data_mode` ("train"/"test") is MiniWoB's problem
    distribution for the tasks that have one.
    """

    name = "miniwob"
    reuse_page = True
    settle_s = 0.0
    status_script = "[WOB_DONE_GLOBAL, WOB_RAW_REWARD_GLOBAL, WOB_REWARD_REASON, location.pathname]"

    def __init__(self, html_dir: str | pathlib.Path | None = None, *, viewport: tuple[int, int] = (500, 240),
                 device_scale_factor: float = 1.0, episode_time_limit_s: float | None = None,
                 data_mode: str | None = None, show_hud: bool = False):
        if episode_time_limit_s is not None and not 0 < episode_time_limit_s * 1000 < NO_TIME_LIMIT_MS:
            raise ValueError(f"episode_time_limit_s must be in (0, {NO_TIME_LIMIT_MS / 1000:g}), got {episode_time_limit_s!r}")
        if data_mode not in (None, "train", "test"):
            raise ValueError(f"data_mode must be None, 'train' or 'test', got {data_mode!r}")
        self.html_dir = pathlib.Path(html_dir) if html_dir is not None else miniwob_html_dir()
        self.viewport = viewport
        self.device_scale_factor = device_scale_factor
        self.episode_time_limit_s = episode_time_limit_s
        self.data_mode = data_mode
        self.show_hud = show_hud
        self._server = LocalHTTPServer(self.html_dir)

    def close(self) -> None:
        """Stops the HTTP server."""
        self._server.close()

    def __enter__(self) -> "MiniWoBSuite":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def base_url(self) -> str:
        """Returns the server's base URL (http://127.0.0.1:<port>/)."""
        return self._server.base_url

    def url(self, task: Task) -> str:
        """Returns the URL of `task`'s page."""
        return self._server.url(task.start_url)

    def request_policy(self, task: Task) -> RequestPolicy:
        """Returns an allowlist of this suite's server only, subresources included."""
        return RequestPolicy(allowed_hosts=(self._server.netloc,), check_subresources=True)

    async def begin(self, page, task: Task, seed: int, timeout_s: float) -> str:
        """Loads `task`'s page (unless already there), starts a seeded episode, and returns its
        utterance."""
        url = self.url(task)
        if page.url != url:
            await page.goto(url, wait_until="load", timeout=timeout_s * 1000)
        limit_ms = NO_TIME_LIMIT_MS if self.episode_time_limit_s is None else int(self.episode_time_limit_s * 1000)
        utterance = await page.evaluate(_wrap(_BEGIN_JS), [seed, limit_ms, self.data_mode, self.show_hud])
        if utterance is None:  # tasks that load content asynchronously flag WOB_TASK_READY themselves
            await page.wait_for_function("() => WOB_TASK_READY === true", timeout=timeout_s * 1000)
            utterance = await page.evaluate(_wrap(_UTTERANCE_JS))
        return str(utterance)

    def status(self, task: Task, value: Any, answer: Action | None) -> EpisodeStatus:
        """Returns the page's verdict: done with the raw reward in [-1, 1]; success only when
        solved (reward >= 1 - 1e-6): a partial reward (click-checkboxes with a wrong box) is not.
        The collection's own rule (collect.success) is the judge's to apply. Leaving the task's
        page (another task's page would report its own reward) or answering before the page is
        done ends the episode with -1."""
        if not (isinstance(value, list) and len(value) == 4):
            return EpisodeStatus(done=True, reward=-1.0, success=False, reason="left the task page")
        done, reward, reason, path = value
        if path != "/" + task.start_url:
            return EpisodeStatus(done=True, reward=-1.0, success=False, reason=f"left the task page for {path}")
        if done is True:
            reward = float(reward)
            solved = is_solved(reward)
            if not isinstance(reason, str):
                reason = "solved" if solved else "partial reward" if reward > 0 else "failure"
            return EpisodeStatus(done=True, reward=reward, success=solved, reason=reason)
        if answer is not None:
            return EpisodeStatus(done=True, reward=-1.0, success=False, reason="answered before the task was done")
        return EpisodeStatus(done=False)
