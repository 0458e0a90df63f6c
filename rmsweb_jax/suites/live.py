"""The live-web suite: WebVoyager, Online-Mind2Web and WebTailBench tasks on real sites.

Episodes end when the agent answers; success comes later from a judge (a later issue), so
the status here carries no reward.
"""
from __future__ import annotations

from typing import Any

from rmsweb_jax.suites.task import Task
from rmsweb_jax.web.actions import Action
from rmsweb_jax.web.safety import RequestPolicy
from rmsweb_jax.web.suite import EpisodeStatus


class LiveSuite:
    """Runs tasks whose start page is a live site (or any URL, e.g. a local test server).

    Each episode gets a fresh browser context (no cookies carried between tasks). The task's
    `allowed_hosts` (plus `extra_hosts`) bound where pages may navigate; with
    `check_subresources` False, images, scripts and the like load from any host, so sites
    keep their CDNs. Tasks without a start URL begin at `default_start_url`.
    """

    name = "live"
    reuse_page = False
    status_script = "null"

    def __init__(self, *, viewport: tuple[int, int] = (1280, 720), device_scale_factor: float = 1.0,
                 default_start_url: str = "https://www.bing.com/", extra_hosts: tuple[str, ...] = (),
                 check_subresources: bool = False, settle_s: float = 0.5, file_roots: tuple[str, ...] = ()):
        self.viewport = viewport
        self.device_scale_factor = device_scale_factor
        self.default_start_url = default_start_url
        self.extra_hosts = tuple(extra_hosts)
        self.check_subresources = check_subresources
        self.settle_s = settle_s
        self.file_roots = tuple(file_roots)

    def request_policy(self, task: Task) -> RequestPolicy:
        """Returns the task's allowlist (None stays the open web) plus `extra_hosts`."""
        hosts = None if task.allowed_hosts is None else (*task.allowed_hosts, *self.extra_hosts)
        return RequestPolicy(allowed_hosts=hosts, file_roots=self.file_roots, check_subresources=self.check_subresources)

    async def begin(self, page, task: Task, seed: int, timeout_s: float) -> str:
        """Opens the task's start page and returns its instruction (`seed` is unused: live
        sites cannot be seeded)."""
        await page.goto(task.start_url or self.default_start_url, wait_until="domcontentloaded", timeout=timeout_s * 1000)
        return task.instruction

    def status(self, task: Task, value: Any, answer: Action | None) -> EpisodeStatus:
        """Returns done once the agent answers; the reward is left to the judge."""
        if answer is not None:
            return EpisodeStatus(done=True, reason="answered")
        return EpisodeStatus(done=False)
