"""The episode plan every environment in the env-steps benchmark runs: which MiniWoB task and
seed each episode uses and where each step clicks. Pure Python (no dependencies), so the
BrowserGym helper can import it from its own venv."""
from __future__ import annotations

import random

# Simple click tasks: random clicks in the task area end some episodes early (a button hit),
# others run to MAX_STEPS.
TASKS = ("click-button", "click-checkboxes", "click-option", "click-tab", "click-link", "focus-text",
         "click-dialog", "click-widget")
MAX_STEPS = 8
# MiniWoB's task area: 160 x 210 CSS pixels at the page's top-left; the instruction takes y < 50.
AREA_X, AREA_Y = (2.0, 158.0), (52.0, 205.0)


def episode_plan(count: int, offset: int = 0) -> list[tuple[int, str, int]]:
    """Returns (episode index, task name, seed) for `count` episodes."""
    return [(i, TASKS[i % len(TASKS)], i) for i in range(offset, offset + count)]


def click_point(episode: int, step: int) -> tuple[float, float]:
    """Returns the CSS-pixel point step `step` of episode `episode` clicks (the same in every
    environment)."""
    rng = random.Random(episode * 1009 + step)
    return (rng.uniform(*AREA_X), rng.uniform(*AREA_Y))


def warmup_plan(workers: int) -> list[tuple[int, str, int]]:
    """Returns an untimed plan meant to show every worker every task page (each task `workers`
    times back to back, so concurrent workers split them); run it with one step per episode."""
    return [(100_000 + i, task, i) for i, task in enumerate(t for t in TASKS for _ in range(workers))]
