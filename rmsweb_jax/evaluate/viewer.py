"""The trajectory viewer: static HTML pages over trajectory stores; write_viewer returns the index.

    python -m rmsweb_jax.evaluate.viewer --store=workdir/store [--store=...] --out=workdir/viewer

index.html has one row per stored attempt ("episode": task, seed, policy, attempt, outcome,
steps, reward) and filters by task, policy and outcome; each episode page shows, step by step,
the screenshot the action was chosen on, the thought, the action, parse/execution errors and the
URL; then the reflections in the attempt's context and the judge's verdict and reasoning.

Choices:
- Markers are drawn into the written PNGs (not an overlay): what you see is one image file, the
  same in any browser or image viewer, and a test can look at its pixels. The click point is a
  magenta ring and cross (MARKER_RGB), the target element's box an orange frame (BOX_RGB), typed
  text a yellow label at its field. Images without a marker are copied byte for byte.
- Everything is in the pages: rows are rendered as HTML and filtered by a few lines of inline
  script (no fetch, no CDN), so the folder works from file:// offline and can be zipped.
- Every stored string is HTML-escaped and nothing stored becomes a link target: a page title or
  thought with markup shows as text, a `javascript:` URL stays text.
- Each episode's files go under episodes/<policy>/<request id>-<hash> (a slug of the id plus a
  hash of it, since ids from live suites may hold any characters).
"""
from __future__ import annotations

import hashlib
import html
import io
import pathlib
import re
import sys
import time
from typing import Sequence

from absl import flags
from PIL import Image, ImageDraw, ImageFont
from tqdm import tqdm

from rmsweb_jax import storage
from rmsweb_jax.collect.records import StepRecord, TrajectoryRecord
from rmsweb_jax.collect.store import TrajectoryStore

MARKER_RGB = (255, 0, 255)  # click point: a colour web pages rarely use
BOX_RGB = (255, 140, 0)  # the target element's box
TEXT_BG_RGB = (255, 240, 0)  # label behind typed text
MARKER_RADIUS = 8  # screenshot pixels at device scale 1
PROGRESS_MIN_EPISODES = 200  # a progress line for stores at least this big
OUTCOMES = ("success", "failure", "judge error", "lost to browser faults")
_SLUG = re.compile(r"[^A-Za-z0-9._-]+")


def write_viewer(stores: Sequence[str | pathlib.Path], out_dir: str | pathlib.Path, *,
                 labels: Sequence[str] | None = None, max_episodes: int = 0) -> pathlib.Path:
    """Returns out_dir/index.html (out_dir may be gs://) after writing the index and one page per episode of `stores`
    (at most `max_episodes` of each store, in task/seed/attempt order; 0: all). `labels` name the
    stores' policies in the pages (default: the store's recorded policy, else its folder name)."""
    stores = [storage.as_path(s) for s in stores]  # a gs:// store is read through its mirror (TrajectoryStore)
    if not stores:
        raise ValueError("write_viewer needs at least one store folder (--store=DIR)")
    if labels is not None and len(labels) != len(stores):
        raise ValueError(f"got {len(labels)} labels {list(labels)} for {len(stores)} stores: give one label per "
                         "store (--label, in --store order) or none")
    if max_episodes < 0:
        raise ValueError(f"max_episodes must be >= 0 (0: every episode), got {max_episodes!r}")
    out_dir, remote = storage.local_side(out_dir)  # a bucket's folder: written in its mirror, then uploaded
    readers = [TrajectoryStore(s) for s in stores]
    try:
        episodes = []
        for store in readers:
            trajs = sorted(store.trajectories(), key=lambda t: (t.task_id, t.seed, t.attempt))
            episodes.append(trajs[:max_episodes] if max_episodes else trajs)
        names = _unique(labels or [_default_label(s, e) for s, e in zip(readers, episodes)])
        total = sum(len(e) for e in episodes)
        started = time.monotonic()
        rows = []
        with tqdm(total=total, desc="viewer", unit="episode", file=sys.stderr, dynamic_ncols=True, mininterval=1.0,
                  disable=total < PROGRESS_MIN_EPISODES) as bar:
            for i, (store, trajs) in enumerate(zip(readers, episodes)):
                folder = f"p{i}-{_slug(names[i])[:40]}"
                pages = {t.request_id: f"episodes/{folder}/{_episode_name(t.request_id)}.html" for t in trajs}
                for traj in trajs:
                    _write_episode(out_dir, pages, traj, store.steps(traj), names[i], stores[i])
                    rows.append((names[i], traj, pages[traj.request_id]))
                    bar.update()
        index = out_dir / "index.html"
        index.write_text(_index_html(rows, names, stores, time.monotonic() - started), encoding="utf-8")
        if remote is not None:
            storage.push_tree(out_dir, remote)
            return remote / index.name
        return index
    finally:
        for store in readers:
            store.close()


# --- images --------------------------------------------------------------------------------
def click_point(step: StepRecord) -> tuple[float, float] | None:
    """Returns the screenshot-pixel point the step's action points at (None: no point)."""
    if step.action.coordinate is None:
        return None
    if step.target is not None and step.target.point is not None:
        css = step.target.point  # what was executed (the model's point mapped and clamped)
    else:
        css = step.observation().coordinate_space.to_css(step.action.coordinate, step.viewport)
    return _to_pixels(step, *css)


def target_box(step: StepRecord) -> tuple[float, float, float, float] | None:
    """Returns the screenshot-pixel box (x0, y0, x1, y1) of the element the action acted on (None: none)."""
    if step.target is None or step.target.element is None:
        return None
    b = step.target.element.bbox
    return (*_to_pixels(step, b.x, b.y), *_to_pixels(step, b.x + b.width, b.y + b.height))


def marked_screenshot(step: StepRecord) -> bytes:
    """Returns the step's screenshot as PNG with the click point, the target's box and typed text
    drawn on it; the stored bytes unchanged when the action has none of them."""
    point, box = click_point(step), target_box(step)
    typed = step.action.text if step.action.name == "type" else None
    if point is None and box is None and typed is None:
        return step.screenshot
    try:
        img = Image.open(io.BytesIO(step.screenshot)).convert("RGB")
    except OSError as e:
        raise ValueError(f"step {step.step} of {step.request_id}: its stored screenshot is not an image "
                         f"({len(step.screenshot)} bytes: {e})") from None
    scale = max(step.screenshot_size[0] / max(step.viewport[0], 1), 1.0)
    width, radius = max(2, round(2 * scale)), round(MARKER_RADIUS * scale)
    draw = ImageDraw.Draw(img)
    if box is not None:
        draw.rectangle(box, outline=BOX_RGB, width=width)
    if point is not None:
        x, y = point
        draw.ellipse((x - radius, y - radius, x + radius, y + radius), outline=MARKER_RGB, width=width)
        draw.line((x - radius - 4 * scale, y, x + radius + 4 * scale, y), fill=MARKER_RGB, width=width)
        draw.line((x, y - radius - 4 * scale, x, y + radius + 4 * scale), fill=MARKER_RGB, width=width)
    if typed is not None:
        at = box or ((*point, *point) if point is not None else (2, 2, 2, 2))
        _label(draw, typed, at, img.size, scale)
    out = io.BytesIO()
    img.save(out, format="PNG", compress_level=3)  # half the time of the default 6, ~15% more bytes
    return out.getvalue()


def _label(draw: ImageDraw.ImageDraw, text: str, box, size: tuple[int, int], scale: float) -> None:
    font = ImageFont.load_default(size=round(12 * scale))
    text = f"type: {text[:40]}{'…' if len(text) > 40 else ''}"
    left, top, right, bottom = draw.textbbox((0, 0), text, font=font)
    w, h = right - left + 6, bottom - top + 4
    # Below the field when it fits, else above it; kept inside the image.
    y = box[3] + 2 if box[3] + 2 + h <= size[1] else max(box[1] - 2 - h, 0)
    x = min(max(box[0], 0), max(size[0] - w, 0))
    draw.rectangle((x, y, x + w, y + h), fill=TEXT_BG_RGB, outline=(0, 0, 0))
    draw.text((x + 3 - left, y + 2 - top), text, fill=(0, 0, 0), font=font)


def _to_pixels(step: StepRecord, x: float, y: float) -> tuple[float, float]:
    (vw, vh), (sw, sh) = step.viewport, step.screenshot_size
    return (x * sw / vw, y * sh / vh)


# --- pages ---------------------------------------------------------------------------------
_STYLE = """body{font:14px/1.4 system-ui,sans-serif;margin:16px;color:#222}table{border-collapse:collapse}
td,th{border-bottom:1px solid #ddd;padding:3px 8px;text-align:left}tr:hover{background:#f4f4f4}
.success,.failure,.error,.lost{font-weight:600}.success{color:#17803d}.failure{color:#b42318}.error,.lost{color:#b54708}
pre{white-space:pre-wrap;background:#f6f6f6;padding:6px;margin:4px 0}
.step{display:flex;gap:16px;border-top:1px solid #ccc;padding:10px 0}.shot{flex:0 0 auto}.info{flex:1;min-width:280px}
.step img,.final img{max-width:100%;border:1px solid #999}
.err{color:#b42318}.k{color:#666}code{background:#f0f0f0}.legend span{padding:0 6px;margin-right:6px}"""


def _e(value) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def _page(title: str, body: str) -> str:
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{_e(title)}</title>"
            f"<style>{_STYLE}</style></head><body>{body}</body></html>")


def outcome(traj: TrajectoryRecord) -> str:
    """Returns the episode's outcome as the viewer files it: one of OUTCOMES."""
    if traj.status == "failed":
        return "lost to browser faults"
    if traj.verdict.outcome == "error":
        return "judge error"
    return "success" if traj.success else "failure"


def _outcome_html(traj: TrajectoryRecord) -> str:
    o = outcome(traj)
    css = {"success": "success", "failure": "failure", "judge error": "error"}.get(o, "lost")
    return f"<span class='{css}'>{_e(o)}</span>"


def _index_html(rows, names: list[str], stores: list[pathlib.Path], elapsed_s: float) -> str:
    tasks = sorted({t.task_id for _, t, _ in rows})
    options = lambda values: "".join(f"<option value='{_e(v)}'>{_e(v)}</option>" for v in values)  # noqa: E731
    summary = []
    for name, store in zip(names, stores):
        mine = [t for n, t, _ in rows if n == name]
        solved = sum(t.success for t in mine)
        summary.append(f"<li><b>{_e(name)}</b>: {len(mine)} episodes, {solved} successes "
                       f"<span class='k'>({_e(store)})</span></li>")
    body = [f"<h1>Trajectories</h1><ul>{''.join(summary)}</ul>",
            f"<p>Task <select id='f-task'><option value=''>all</option>{options(tasks)}</select> "
            f"Policy <select id='f-policy'><option value=''>all</option>{options(names)}</select> "
            f"Outcome <select id='f-outcome'><option value=''>all</option>{options(OUTCOMES)}</select> "
            f"<span id='shown'></span></p>",
            "<table id='episodes'><thead><tr><th>task</th><th>seed</th><th>policy</th><th>attempt</th><th>outcome</th>"
            "<th>steps</th><th>reward</th><th></th></tr></thead><tbody>"]
    for name, t, page in rows:
        reward = "" if t.reward is None else f"{t.reward:g}"
        body.append(f"<tr data-task='{_e(t.task_id)}' data-policy='{_e(name)}' data-outcome='{_e(outcome(t))}' "
                    f"data-request='{_e(t.request_id)}'><td>{_e(t.task_id)}</td><td>{t.seed}</td><td>{_e(name)}</td>"
                    f"<td>{t.attempt}</td><td>{_outcome_html(t)}</td><td>{t.num_steps}</td><td>{reward}</td>"
                    f"<td><a href='{_e(page)}'>view</a></td></tr>")
    body.append(f"</tbody></table><p class='k'>Written in {elapsed_s:.1f} s.</p>{_FILTER_JS}")
    return _page("Trajectories", "".join(body))


# The filters live in the URL's fragment, so the back button returns to the same selection.
_FILTER_JS = """<script>
const keys = ["task", "policy", "outcome"];
const sel = Object.fromEntries(keys.map(k => [k, document.getElementById("f-" + k)]));
function apply() {
  let shown = 0; const rows = document.querySelectorAll("#episodes tbody tr");
  for (const row of rows) {
    const ok = keys.every(k => !sel[k].value || row.dataset[k] === sel[k].value);
    row.hidden = !ok; shown += ok;
  }
  document.getElementById("shown").textContent = shown + " of " + rows.length + " episodes";
  const params = new URLSearchParams(); keys.forEach(k => sel[k].value && params.set(k, sel[k].value));
  history.replaceState(null, "", "#" + params.toString());
}
const start = new URLSearchParams(location.hash.slice(1));
keys.forEach(k => { if (start.has(k)) sel[k].value = start.get(k); sel[k].addEventListener("change", apply); });
apply();
</script>"""


def _write_episode(out_dir: pathlib.Path, pages: dict[str, str], traj: TrajectoryRecord, steps: list[StepRecord],
                   label: str, store: pathlib.Path) -> None:
    page = out_dir / pages[traj.request_id]
    images = page.with_suffix("")
    images.mkdir(parents=True, exist_ok=True)
    up = "../../"  # episodes/<policy>/ back to the index
    v = traj.verdict
    siblings = " ".join(f"<b>{a}</b>" if a == traj.attempt else f"<a href='{_e(pathlib.Path(p).name)}'>{a}</a>"
                        for a, p in _attempt_pages(pages, traj))
    reward = "n/a" if traj.reward is None else f"{traj.reward:g}"
    body = [f"<p><a href='{up}index.html'>&larr; all episodes</a></p>",
            f"<h1>{_e(traj.task_id)} <span class='k'>seed {traj.seed}, attempt {traj.attempt}</span></h1>",
            f"<p>{_outcome_html(traj)} &middot; reward {reward} &middot; {traj.num_steps} steps &middot; "
            f"{traj.wall_s:.1f} s &middot; policy <b>{_e(label)}</b> ({_e(traj.policy)}) &middot; ended: "
            f"{_e(traj.end_reason)} &middot; attempts: <span class='attempts'>{siblings}</span></p>",
            f"<p><span class='k'>Instruction:</span> {_e(traj.instruction)}</p>",
            "<h2>Reflections in context</h2>",
            ("<ol>" + "".join(f"<li><pre>{_e(r)}</pre></li>" for r in traj.reflections) + "</ol>")
            if traj.reflections else "<p class='k'>none (first attempt)</p>",
            f"<h2>Verdict</h2><p><b>{_e(v.outcome)}</b> by {_e(v.judge or traj.judge)}"
            f"{'' if v.score is None else f', score {v.score:g}'}, {v.calls} judge calls"
            f"{f' ({v.prompt_tokens} + {v.completion_tokens} tokens)' if v.calls else ''}</p><pre>{_e(v.reason)}</pre>"
            + (f"<details><summary>judge's raw output</summary><pre>{_e(v.raw)}</pre></details>" if v.raw else ""),
            "".join(f"<p class='err'>browser fault: {_e(f)}</p>" for f in traj.faults),
            "<h2>Steps</h2><p class='legend'><span style='border:2px solid #f0f'>click point</span>"
            "<span style='border:2px solid #ff8c00'>target element</span>"
            "<span style='background:#fff000'>typed text</span></p>"]
    for step in steps:
        name = f"step_{step.step:03d}.png"
        (images / name).write_bytes(marked_screenshot(step))
        body.append(_step_html(step, f"{_e(images.name)}/{name}"))
    body.append("<h2>After the last action</h2><div class='final'>"
                f"<p class='k'>URL <code>{_e(traj.final_url)}</code></p>")
    if traj.final_answer is not None:
        body.append(f"<p><span class='k'>Answer:</span> {_e(traj.final_answer)}</p>")
    if traj.final_screenshot:
        (images / "final.png").write_bytes(traj.final_screenshot)
        body.append(f"<img src='{_e(images.name)}/final.png' alt='final page'>")
    body.append(f"</div><p class='k'>{_e(traj.request_id)} in {_e(store)}</p>")
    page.write_text(_page(f"{traj.request_id} ({label})", "".join(body)), encoding="utf-8")


def _step_html(step: StepRecord, src: str) -> str:
    errors = "".join(f"<p class='err'>{what}: {_e(msg)}</p>" for what, msg in
                     (("parse error", step.parse_error), ("execution error", step.exec_error),
                      ("previous action's error on the page", step.last_error)) if msg)
    mistake = f"<p class='err'>teacher's injected mistake: {_e(step.label)}</p>" if step.label else ""
    raw = (f"<details><summary>raw turn</summary><pre>{_e(step.text)}</pre></details>"
           if step.text != step.action_text else "")
    return (f"<div class='step' id='step-{step.step}'><div class='shot'><a href='{src}'><img class='screen' "
            f"src='{src}' width='{step.screenshot_size[0]}' alt='step {step.step + 1}'></a></div><div class='info'>"
            f"<h3>Step {step.step + 1}</h3><p class='k'>URL <code>{_e(step.url)}</code><br>title {_e(step.title)}</p>"
            f"<p><span class='k'>Thought:</span> {_e(step.thought)}</p>"
            f"<p class='k'>Action ({_e(step.action.name)}):</p><pre class='action'>{_e(step.action_text)}</pre>"
            f"{errors}{mistake}{raw}</div></div>")


def _attempt_pages(pages: dict[str, str], traj: TrajectoryRecord) -> list[tuple[int, str]]:
    """Returns (attempt, page) of every written attempt of `traj`'s task and seed, in attempt order."""
    prefix = traj.request_id.rsplit("@", 1)[0] + "@"
    found = [(int(rid[len(prefix):]), page) for rid, page in pages.items()
             if rid.startswith(prefix) and rid[len(prefix):].isdigit()]
    return sorted(found)


# --- names ---------------------------------------------------------------------------------
def _slug(text: str) -> str:
    return _SLUG.sub("_", text).strip("_.") or "x"


def _episode_name(request_id: str) -> str:
    return f"{_slug(request_id)[:80]}-{hashlib.sha1(request_id.encode()).hexdigest()[:8]}"


def _default_label(store: TrajectoryStore, trajs: list[TrajectoryRecord]) -> str:
    return store.policy or (trajs[0].policy if trajs and trajs[0].policy else store.directory.name)


def _unique(names: Sequence[str]) -> list[str]:
    seen: dict[str, int] = {}
    out = []
    for name in names:
        seen[name] = seen.get(name, 0) + 1
        out.append(name if seen[name] == 1 else f"{name} #{seen[name]}")
    return out


# --- command line --------------------------------------------------------------------------
def main(argv: Sequence[str]) -> None:
    """Writes the viewer for --store folders into --out and prints where its index is."""
    del argv
    f = flags.FLAGS
    started = time.monotonic()
    index = write_viewer(f.store, f.out, labels=f.label or None, max_episodes=f.max_episodes)
    print(f"viewer written in {time.monotonic() - started:.1f} s: {index}")


if __name__ == "__main__":
    from rmsweb_jax.errors import run_absl_command

    flags.DEFINE_multi_string("store", None, "A trajectory store folder (repeat for several policies).")
    flags.DEFINE_string("out", None, "Folder to write index.html and the episode pages into.")
    flags.DEFINE_multi_string("label", None, "The policy name shown for each --store, in order (default: the "
                                             "store's recorded policy, else its folder name).")
    flags.DEFINE_integer("max_episodes", 0, "At most this many episodes of each store (0: all).")
    flags.mark_flags_as_required(["store", "out"])
    run_absl_command(main, "viewer")  # --help exits 0; a missing store or flag is one line, status 2
