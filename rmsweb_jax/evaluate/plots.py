"""PNG charts of an evaluation, drawn with PIL alone: success by task with interval whiskers, and
training curves from TensorBoard scalars.

The look follows the collection report's chart (collect/report.py): white ground, PIL's default font,
black axes, flat bars in the same blue and green. matplotlib is not a dependency: these two charts
need bars, lines and text, which PIL draws in a few dozen lines each.
"""
from __future__ import annotations

import math
import os
import pathlib
from typing import Mapping, Sequence

from PIL import Image, ImageDraw

from rmsweb_jax import storage

# One colour per policy, in the order the rows are given; the first two are the collection report's.
POLICY_COLORS = ((52, 110, 190), (70, 150, 90), (214, 120, 40), (150, 80, 170), (200, 60, 70),
                 (40, 160, 170), (140, 110, 60), (110, 110, 110))
WHISKER_COLOR = (25, 25, 25)
GRID_COLOR = (225, 225, 225)
# The curves a training stage is summed up by (train/metrics.py writes every scalar as train/<name>).
DEFAULT_CURVE_TAGS = ("train/loss", "train/grad_norm", "train/learning_rate")

_TEXT_H = 11  # height of a line of PIL's default font


def policy_color(index: int) -> tuple[int, int, int]:
    """Returns the bar colour of the index-th policy (the palette repeats past its end)."""
    return POLICY_COLORS[index % len(POLICY_COLORS)]


def _text_width(draw: ImageDraw.ImageDraw, text: str) -> int:
    left, _, right, _ = draw.textbbox((0, 0), text)
    return int(math.ceil(right - left))


def _vertical_text(text: str, fill=(0, 0, 0)) -> Image.Image:
    """Returns `text` drawn on a transparent tile turned 90 degrees (read bottom to top)."""
    probe = ImageDraw.Draw(Image.new("RGBA", (1, 1)))
    tile = Image.new("RGBA", (_text_width(probe, text) + 2, _TEXT_H + 4), (255, 255, 255, 0))
    ImageDraw.Draw(tile).text((1, 1), text, fill=fill)
    return tile.rotate(90, expand=True)


def _check_fraction(value, where: str) -> float:
    value = float(value)
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"success_by_task_png: {where} = {value}: expected a fraction in [0, 1]")
    return value


def success_by_task_png(rows: Mapping[str, Mapping[str, Mapping]], path: str | os.PathLike, *,
                        title: str = "success by task (%), whiskers: 95% interval") -> pathlib.Path:
    """Returns `path`, where a grouped bar chart is written: per task (x axis), one bar per policy (its
    own colour, legend above) at its success rate, with a whisker over its interval; y axis 0-100%.

    rows[policy_label][task_id] = {"success": fraction, "ci95": [low, high]}; a task a policy lacks
    has no bar in its group."""
    if not rows:
        raise ValueError("success_by_task_png: no policies to plot (rows is empty)")
    policies = list(rows)
    tasks = sorted({task for by_task in rows.values() for task in by_task})
    if not tasks:
        raise ValueError(f"success_by_task_png: no tasks for any of the policies {policies}")
    probe = ImageDraw.Draw(Image.new("RGB", (1, 1)))
    bar_w = 22 if len(policies) <= 3 else 14
    group_w = bar_w * len(policies) + 18
    label_w = max(_text_width(probe, t) for t in tasks)
    vertical = label_w > group_w - 4
    legend = [(label, policy_color(i), _text_width(probe, label)) for i, label in enumerate(policies)]
    legend_w = sum(20 + w + 14 for _, _, w in legend)
    left, right, top, plot_h = 52, 20, 56, 260
    bottom = (label_w + 14) if vertical else 30
    width = max(left + group_w * len(tasks) + right, left + legend_w + right, 420)
    height = top + plot_h + bottom
    img = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(img)
    y0, y1, x0, x1 = top, top + plot_h, left, width - right

    def y_of(fraction: float) -> float:
        return y1 - plot_h * fraction

    draw.text((x0, 8), title, fill="black")
    x = x0
    for label, color, w in legend:
        draw.rectangle([x, 30, x + 12, 42], fill=color)
        draw.text((x + 18, 30), label, fill="black")
        x += 20 + w + 14
    for pct in (0, 25, 50, 75, 100):
        y = round(y_of(pct / 100))
        if pct:
            draw.line([(x0 + 1, y), (x1, y)], fill=GRID_COLOR)
        draw.line([(x0 - 4, y), (x0, y)], fill="black")
        text = f"{pct}%"
        draw.text((x0 - 8 - _text_width(draw, text), y - 6), text, fill="black")
    draw.line([(x0, y0), (x0, y1), (x1, y1)], fill="black")
    for t, task in enumerate(tasks):
        group_left = x0 + t * group_w + 9
        for p, label in enumerate(policies):
            cell = rows[label].get(task)
            if cell is None:
                continue
            success = _check_fraction(cell["success"], f"rows[{label!r}][{task!r}]['success']")
            bar_left = group_left + p * bar_w
            bar_top = min(round(y_of(success)), y1 - 1)  # a zero still shows as a line
            draw.rectangle([bar_left, bar_top, bar_left + bar_w - 1, y1 - 1], fill=policy_color(p))
            interval = cell.get("ci95")
            if interval is not None:
                low, high = (_check_fraction(v, f"rows[{label!r}][{task!r}]['ci95']") for v in interval)
                centre, cap = bar_left + bar_w // 2, max(2, bar_w // 4)
                y_low, y_high = round(y_of(low)), round(y_of(high))
                draw.line([(centre, y_low), (centre, y_high)], fill=WHISKER_COLOR)
                draw.line([(centre - cap, y_low), (centre + cap, y_low)], fill=WHISKER_COLOR)
                draw.line([(centre - cap, y_high), (centre + cap, y_high)], fill=WHISKER_COLOR)
        middle = x0 + t * group_w + group_w // 2
        if vertical:
            tile = _vertical_text(task)
            img.paste(tile, (middle - tile.width // 2, y1 + 6), tile)
        else:
            draw.text((middle - _text_width(draw, task) // 2, y1 + 8), task, fill="black")
    return storage.write_png(path, img)


def _fmt(value: float) -> str:
    if value == 0 or 1e-3 <= abs(value) < 1e5:
        return f"{value:.4g}"
    return f"{value:.2e}"


def _curve_panel(draw: ImageDraw.ImageDraw, box: tuple[int, int, int, int], title: str,
                 points: Sequence[tuple[int, float]], color: tuple[int, int, int]) -> None:
    x0, y0, x1, y1 = box
    draw.text((x0, y0 - 18), title, fill="black")
    draw.line([(x0, y0), (x0, y1), (x1, y1)], fill="black")
    points = [(s, v) for s, v in points if math.isfinite(v)]
    if not points:
        draw.text((x0 + 10, (y0 + y1) // 2), "no data", fill="gray")
        return
    steps, values = [s for s, _ in points], [v for _, v in points]
    s_min, s_max, v_min, v_max = min(steps), max(steps), min(values), max(values)
    pad = (v_max - v_min) * 0.05 or abs(v_max) * 0.05 or 1.0  # a flat curve still gets a y range
    lo, hi = v_min - pad, v_max + pad

    def xy(step: int, value: float) -> tuple[float, float]:
        fx = (step - s_min) / (s_max - s_min) if s_max > s_min else 0.5
        return x0 + 2 + fx * (x1 - x0 - 4), y1 - 2 - (value - lo) / (hi - lo) * (y1 - y0 - 4)

    for value in (v_max, v_min):
        y = xy(s_min, value)[1]
        draw.line([(x0 - 4, y), (x0, y)], fill="black")
        text = _fmt(value)
        draw.text((x0 - 6 - _text_width(draw, text), y - 6), text, fill="black")
    for step, anchor in ((s_min, "la"), (s_max, "ra")):
        draw.text((xy(step, lo)[0], y1 + 4), str(step), fill="black", anchor=anchor)
    line = [xy(s, v) for s, v in points]
    if len(line) == 1:
        (cx, cy), = line
        draw.ellipse([cx - 2, cy - 2, cx + 2, cy + 2], fill=color)
    else:
        draw.line(line, fill=color, width=2)


def training_curves_png(curves: Mapping[str, Mapping[str, Sequence[tuple[int, float]]]], path: str | os.PathLike,
                        tags: Sequence[str] | None = None) -> pathlib.Path:
    """Returns `path`, where one row of panels per stage is written (curves[stage][tag] = [(step,
    value)], e.g. from tb_events.read_scalars), one panel per tag against the step. `tags` defaults to
    those of DEFAULT_CURVE_TAGS that any stage has (else the first three tags there are)."""
    if not curves:
        raise ValueError("training_curves_png: no stages to plot (curves is empty)")
    present = sorted({tag for by_tag in curves.values() for tag in by_tag})
    if tags is None:
        tags = [t for t in DEFAULT_CURVE_TAGS if t in present] or present[:3]
    tags = list(tags)
    if not tags:
        raise ValueError(f"training_curves_png: the stages {list(curves)} have no scalar curves")
    panel_w, panel_h, left, gap_x, top, gap_y = 260, 150, 70, 84, 44, 62
    width = left + len(tags) * panel_w + (len(tags) - 1) * gap_x + 24
    height = top + len(curves) * (panel_h + gap_y)
    img = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(img)
    draw.text((left, 8), "training curves (value against step)", fill="black")
    for r, (stage, by_tag) in enumerate(curves.items()):
        for c, tag in enumerate(tags):
            x = left + c * (panel_w + gap_x)
            y = top + r * (panel_h + gap_y)
            _curve_panel(draw, (x, y, x + panel_w, y + panel_h), f"{stage}: {tag}", by_tag.get(tag, []),
                         policy_color(r))
    return storage.write_png(path, img)
