"""The mining report, from the mined states alone: report.json, report.md and failure_modes.png.

Counts critical and routine states (per source: replay, rollout), critical states per failure mode,
the teacher-noise share (critical states whose reference step carries a teacher label: the policy
"fails" there by not copying the scripted teacher's injected mistake), a table by task, the mean
reference log-prob of critical and routine states (how well the cheap one-pass signal separates
them), and what the run measured (throughput, steps skipped by label, the state set written).
"""
from __future__ import annotations

import collections
import json
import pathlib
from typing import Any, Sequence

from PIL import Image, ImageDraw

from rmsweb_jax import storage
from rmsweb_jax.mining.state_set import SOURCES, CriticalState
from rmsweb_jax.mining.taxonomy import TAXONOMY

JSON_NAME, MARKDOWN_NAME, PLOT_NAME = "report.json", "report.md", "failure_modes.png"


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def compute_report(states: Sequence[CriticalState], *, tau: float, extra: dict[str, Any] | None = None
                   ) -> dict[str, Any]:
    """Returns the report of the mined `states` (every one, before the state set's routine share is
    drawn); `extra` (throughput, skipped steps, the state set written) is included as it is."""
    critical = [s for s in states if s.critical]
    noise = [s for s in critical if s.teacher_label is not None]
    by_task: dict[str, dict[str, Any]] = {}
    for task_id in sorted({s.task_id for s in states}):
        mine = [s for s in states if s.task_id == task_id]
        modes = collections.Counter(s.failure_mode for s in mine if s.critical)
        accuracies = [s.replay_accuracy for s in mine if s.replay_accuracy is not None]
        by_task[task_id] = {"states": len(mine), "critical": sum(s.critical for s in mine),
                            "critical_share": sum(s.critical for s in mine) / len(mine),
                            "mean_replay_accuracy": _mean(accuracies),
                            "top_failure_mode": modes.most_common(1)[0][0] if modes else None}
    logprob = {kind: _mean([s.reference_logprob for s in states
                            if s.reference_logprob is not None and s.critical == (kind == "critical")])
               for kind in ("critical", "routine")}
    return {
        "tau": tau,
        "states": len(states),
        "critical": len(critical),
        "routine": len(states) - len(critical),
        "critical_share": len(critical) / len(states) if states else 0.0,
        "by_source": {src: {"states": sum(s.source == src for s in states),
                            "critical": sum(s.source == src and s.critical for s in states)} for src in SOURCES},
        "failure_modes": {mode: sum(s.failure_mode == mode for s in critical) for mode in TAXONOMY},
        "teacher_noise": {"critical_with_label": len(noise),
                          "share_of_critical": len(noise) / len(critical) if critical else 0.0,
                          "by_label": dict(sorted(collections.Counter(s.teacher_label for s in noise).items()))},
        "mean_replay_accuracy": _mean([s.replay_accuracy for s in states if s.replay_accuracy is not None]),
        "mean_reference_logprob": logprob,
        "by_task": by_task,
        **(extra or {}),
    }


def _fmt(value: float | None, spec: str = ".3f") -> str:
    return "—" if value is None else format(value, spec)


def render_markdown(report: dict[str, Any]) -> str:
    """Returns the report as markdown: summary, failure modes, teacher noise, per task, throughput."""
    noise = report["teacher_noise"]
    lines = ["# Mining report", "",
             f"{report['states']} states mined, {report['critical']} critical (replay accuracy < tau = "
             f"{report['tau']:g}), {report['routine']} routine.", "",
             "| figure | value |", "|---|---|",
             f"| critical share | {100 * report['critical_share']:.1f}% |",
             *(f"| {src} states / critical | {row['states']} / {row['critical']} |"
               for src, row in report["by_source"].items()),
             f"| mean replay accuracy | {_fmt(report['mean_replay_accuracy'])} |",
             f"| mean log p(reference action), critical / routine | "
             f"{_fmt(report['mean_reference_logprob']['critical'], '.2f')} / "
             f"{_fmt(report['mean_reference_logprob']['routine'], '.2f')} |",
             f"| teacher noise (critical states on a teacher-labelled step) | {noise['critical_with_label']} "
             f"({100 * noise['share_of_critical']:.1f}% of critical; {noise['by_label'] or 'none'}) |"]
    if "skipped" in report:
        lines.append(f"| reference steps skipped by label | {report['skipped'] or 'none'} |")
    if "state_set" in report:
        ss = report["state_set"]
        lines.append(f"| state set | {ss['states']} states ({ss['critical']} critical, {ss['routine']} routine) "
                     f"at `{ss['path']}` |")
    lines += ["", "## Failure modes of critical states", "", "| failure mode | states |", "|---|---|"]
    lines += [f"| {mode} | {n} |" for mode, n in report["failure_modes"].items()]
    in_set = report.get("state_set", {}).get("by_task", {})
    lines += ["", "## By task", "", "| task | states | critical | critical share | in the state set | "
              "mean replay accuracy | top failure mode |", "|---|---|---|---|---|---|---|"]
    lines += [f"| {task} | {row['states']} | {row['critical']} | {100 * row['critical_share']:.1f}% | "
              f"{in_set.get(task, '—')} | {_fmt(row['mean_replay_accuracy'])} | {row['top_failure_mode'] or '—'} |"
              for task, row in report["by_task"].items()]
    if "throughput" in report:
        t = report["throughput"]
        lines += ["", "## Replay throughput", "",
                  f"{t['states']} states, {t['samples']} samples in {t['seconds']:.1f} s: "
                  f"{t['states_per_s']:.3f} states/s; time in sampling {100 * t['sampling_share']:.1f}%, "
                  f"scoring {100 * t['scoring_share']:.2f}%, reference log-probs {100 * t['logprob_share']:.1f}%."]
        if t["states_per_s_after_first_batch"] is not None:  # None: the first batch was the only one
            lines.append(f"After the first batch ({t['first_batch_states']} states in "
                         f"{t['first_batch_seconds']:.1f} s, the programs' compiles included): "
                         f"{t['states_per_s_after_first_batch']:.3f} states/s.")
    return "\n".join(lines) + "\n"


def render_plot(report: dict[str, Any], size: tuple[int, int] = (720, 360)) -> Image.Image:
    """Returns a horizontal bar chart of critical states per failure mode (every TAXONOMY mode, zeros included)."""
    width, height = size
    img = Image.new("RGB", size, "white")
    draw = ImageDraw.Draw(img)
    draw.text((12, 10), f"critical states by failure mode ({report['critical']} of {report['states']}, "
                        f"tau {report['tau']:g})", fill="black")
    modes = list(report["failure_modes"].items())
    left, right, top, bottom = 140, width - 60, 40, height - 16
    row = (bottom - top) / max(len(modes), 1)
    peak = max([n for _, n in modes], default=0) or 1
    draw.line([(left, top), (left, bottom)], fill="black")
    for i, (mode, n) in enumerate(modes):
        y0 = top + i * row + row * 0.15
        y1 = top + (i + 1) * row - row * 0.15
        draw.text((10, y0), mode, fill="black")
        x1 = left + (right - left) * n / peak
        draw.rectangle([left, y0, max(x1, left + 1), y1], fill=(200, 80, 60))  # a zero still shows as a line
        draw.text((max(x1, left + 1) + 6, y0), str(n), fill="black")
    return img


def write_report(out_dir: str | pathlib.Path, report: dict[str, Any]) -> dict[str, pathlib.Path]:
    """Writes report.json, report.md and failure_modes.png into `out_dir` (a local folder or gs://); returns their
    paths."""
    out_dir = storage.as_path(out_dir)
    paths = {"json": out_dir / JSON_NAME, "markdown": out_dir / MARKDOWN_NAME, "plot": out_dir / PLOT_NAME}
    storage.write_text_atomic(paths["json"], json.dumps(report, indent=2))
    storage.write_text_atomic(paths["markdown"], render_markdown(report))
    storage.write_png(paths["plot"], render_plot(report))
    return paths
