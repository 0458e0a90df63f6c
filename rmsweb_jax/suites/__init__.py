"""Task suites: MiniWoB++ (local, programmatic reward) and the live web benchmarks' loaders."""
from rmsweb_jax.suites.live import LiveSuite
from rmsweb_jax.suites.miniwob import MiniWoBSuite, load_miniwob_tasks, miniwob_html_dir
from rmsweb_jax.suites.online_mind2web import load_online_mind2web
from rmsweb_jax.suites.task_files import TaskFileError
from rmsweb_jax.suites.task import RubricItem, Task
from rmsweb_jax.suites.webtailbench import load_webtailbench
from rmsweb_jax.suites.webvoyager import load_gaia_web, load_reference_answers, load_webvoyager

__all__ = [
    "LiveSuite", "MiniWoBSuite", "RubricItem", "Task", "TaskFileError", "load_gaia_web", "load_miniwob_tasks",
    "load_online_mind2web", "load_reference_answers", "load_webtailbench", "load_webvoyager", "miniwob_html_dir",
]
