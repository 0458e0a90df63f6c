"""What a worker needs from a task suite: how to start an episode and how to read its outcome."""
from __future__ import annotations

import dataclasses
from typing import Any, Protocol

from rmsweb_jax.web.actions import Action
from rmsweb_jax.web.safety import RequestPolicy


@dataclasses.dataclass(frozen=True)
class EpisodeStatus:
    """The suite's verdict after an observation: finished?, reward and success when known."""

    done: bool = False
    reward: float | None = None
    success: bool | None = None
    reason: str | None = None


class Suite(Protocol):
    """A family of tasks a BrowserWorker can run (MiniWoB++, live web benchmarks).

    `status_script` is a JavaScript expression evaluated in the page with every observation
    (same round trip as the title); its value is handed to `status`.
    """

    name: str
    viewport: tuple[int, int]
    device_scale_factor: float
    reuse_page: bool       # keep one page across episodes (fast) or a fresh context per episode
    settle_s: float        # pause after actions that may navigate, before observing
    status_script: str

    def request_policy(self, task: Any) -> RequestPolicy:
        """Returns the allowlist and file rule for `task`."""

    async def begin(self, page: Any, task: Any, seed: int, timeout_s: float) -> str:
        """Starts `task` with `seed` on `page` and returns the instruction shown to the agent."""

    def status(self, task: Any, value: Any, answer: Action | None) -> EpisodeStatus:
        """Returns `task`'s episode status from the status_script `value` and the answer action
        (if the last action was one)."""
