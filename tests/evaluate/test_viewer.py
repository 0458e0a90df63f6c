"""The trajectory viewer on a real store (RetryCollector + ScriptedTeacher with mistakes on real
MiniWoB++ pages in real Chromium): the index opened from file:// in headless Chromium through
our Playwright stack, filtered to failures, clicked through to an episode whose step count,
action texts and reflections match the store, and a pixel check that the click marker in the
rendered image sits where the stored action points (and is absent from the stored screenshot,
so the check fails when nothing is drawn). Stored markup never runs."""
import asyncio
import dataclasses
import io
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image
from playwright.async_api import async_playwright

from rmsweb_jax.agents.teacher import MistakeConfig, ScriptedTeacher
from rmsweb_jax.collect.records import request_id
from rmsweb_jax.collect.retries import RetryCollector
from rmsweb_jax.collect.store import TrajectoryStore
from rmsweb_jax.collect.store_fixture import click_step, retry_group
from rmsweb_jax.evaluate.viewer import marked_screenshot, write_viewer
from rmsweb_jax.judges.base import Verdict
from rmsweb_jax.judges.programmatic import ProgrammaticJudge
from rmsweb_jax.suites.miniwob import MiniWoBSuite, load_miniwob_tasks
from rmsweb_jax.web.actions import Action
from rmsweb_jax.web.browser import close_browser, launch_chromium, new_marker
from tests.settings import collect_settings, store_writer

TASKS = ("miniwob.login-user", "miniwob.enter-text", "miniwob.click-button")
SEEDS = (0, 1)
# Rates high enough that attempt 1 fails on some groups, which are retried with a reflection.
MISTAKES = MistakeConfig(wrong_element_p=0.25, detour_p=0.1, early_stop_p=0.1, seed=0)
WAIT_MS = 30_000  # upper bound on a browser event; only reached when the viewer is broken
PAYLOAD = "<script>window.__pwned = 1</script><img src=x onerror='window.__pwned = 2'>"


def marker_pixels(png: bytes) -> np.ndarray:
    """Returns the (x, y) of every pixel of the click marker's colour (magenta) in `png`."""
    rgb = np.asarray(Image.open(io.BytesIO(png)).convert("RGB")).astype(int)
    ys, xs = np.nonzero((rgb[..., 0] > 200) & (rgb[..., 1] < 80) & (rgb[..., 2] > 200))
    return np.stack([xs, ys], axis=1)


def expected_point(step) -> tuple[float, float]:
    """Returns the screenshot pixel the stored action's coordinate points at, computed here from
    Action.coordinate, the coordinate kind, the viewport and the screenshot size."""
    (vw, vh), (sw, sh) = step.viewport, step.screenshot_size
    x, y = step.action.coordinate
    if step.coordinates == "relative":
        x, y = x / 1000 * sw, y / 1000 * sh
    return min(x, sw * (vw - 1) / vw), min(y, sh * (vh - 1) / vh)  # the executor clamps inside the viewport


def marker_fits(step) -> bool:
    """Returns whether the step has a point whose whole marker lies inside the screenshot."""
    if step.action.coordinate is None:
        return False
    (x, y), (w, h) = expected_point(step), step.screenshot_size
    return 14 < x < w - 14 and 14 < y < h - 14


def assert_marker_at(png: bytes, point: tuple[float, float], scale: float = 1.0) -> None:
    """Asserts the marker is drawn centred on `point` and nowhere else (all its pixels within its radius)."""
    pixels = marker_pixels(png)
    assert len(pixels) > 20, "no click marker in the image"
    centre = pixels.mean(axis=0)
    assert np.hypot(*(centre - point)) <= 1.5 * scale, (centre, point)
    assert np.hypot(*(pixels - point).T).max() <= 14 * scale, "marker-coloured pixels away from the click point"


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """A real collection: K=2 retries of the teacher with mistakes on three MiniWoB++ tasks."""
    known = {t.id: t for t in load_miniwob_tasks()}
    directory = tmp_path_factory.mktemp("viewer") / "store"
    with MiniWoBSuite() as suite, store_writer(directory) as writer:
        RetryCollector(suite, ScriptedTeacher(MISTAKES, tasks=TASKS), ProgrammaticJudge(success="solved"), writer,
                       collect_settings(
                       attempts=2, workers=2, max_steps=8, progress=False)).run([known[t] for t in TASKS], SEEDS)
    return directory


async def _browse(script, *, width=1200, height=900):
    marker = new_marker()
    async with async_playwright() as pw:
        browser = await launch_chromium(pw, marker)
        try:
            page = await browser.new_page(viewport={"width": width, "height": height})
            page.set_default_timeout(WAIT_MS)
            dialogs = []
            page.on("dialog", lambda d: (dialogs.append(d.message), asyncio.ensure_future(d.dismiss())))
            return await script(page, dialogs)
        finally:
            await close_browser(browser, marker)


@pytest.mark.browser
def test_filter_to_failures_click_through_and_the_marker_is_at_the_stored_point(store, tmp_path):
    with TrajectoryStore(store) as reader:
        trajs = list(reader.trajectories())
        all_steps = {t.request_id: reader.steps(t) for t in trajs}
    failed = {t.request_id for t in trajs if not t.success}
    assert failed and any(t.attempt == 2 for t in trajs), "the collection must hold failures and retries"
    # A failed first attempt that was retried, with a pointer step whose marker fits in the image.
    pick = next(t for t in sorted(trajs, key=lambda t: t.request_id) if not t.success and t.attempt == 1
                and any(r.request_id == request_id(t.task_id, t.seed, 2) for r in trajs)
                and any(map(marker_fits, all_steps[t.request_id])))
    steps = all_steps[pick.request_id]
    k = next(s.step for s in steps if marker_fits(s))
    retry = next(r for r in trajs if r.request_id == request_id(pick.task_id, pick.seed, 2))
    index = write_viewer([store], tmp_path / "viewer")
    assert index == tmp_path / "viewer" / "index.html"

    async def script(page, dialogs):
        await page.goto(index.as_uri())
        rows = page.locator("#episodes tbody tr")
        assert await rows.count() == len(trajs)
        await page.select_option("#f-outcome", "failure")
        visible = page.locator("#episodes tbody tr:visible")
        shown = set(await visible.evaluate_all("rows => rows.map(r => r.dataset.request)"))
        assert shown == failed
        await page.locator(f"#episodes tr[data-request='{pick.request_id}'] a").click()
        await page.wait_for_selector(".step")
        episode = page.url
        assert await page.locator(".step").count() == pick.num_steps == len(steps)
        assert await page.locator("pre.action").all_inner_texts() == [s.action_text for s in steps]
        img = page.locator(f"#step-{k} img.screen")
        await img.evaluate("i => i.complete || new Promise(r => i.onload = r)")
        await img.scroll_into_view_if_needed()
        # The image's content box as rendered (inside its border), in page pixels.
        box = await img.evaluate("i => { const r = i.getBoundingClientRect(); return {x: r.x + i.clientLeft, "
                                 "y: r.y + i.clientTop, width: i.clientWidth, height: i.clientHeight}; }")
        rendered = await page.screenshot(clip=box)
        natural = await img.evaluate("i => [i.naturalWidth, i.clientWidth]")
        await page.locator(".attempts a", has_text="2").click()  # the retry's page, via the attempt links
        await page.wait_for_selector("h2")
        reflections = await page.locator("ol li pre").all_inner_texts()
        await page.go_back()
        await page.go_back()
        await page.wait_for_selector("#episodes")
        still = set(await page.locator("#episodes tbody tr:visible").evaluate_all(
            "rows => rows.map(r => r.dataset.request)"))
        return episode, rendered, natural, reflections, still, dialogs

    episode, rendered, (natural_w, client_w), reflections, still, dialogs = asyncio.run(_browse(script))
    assert episode.endswith(".html") and not dialogs
    assert reflections == list(retry.reflections) and retry.reflections
    assert still == failed  # the filter survives the back button (it lives in the URL's fragment)

    step = steps[k]
    scale = client_w / natural_w
    assert Image.open(io.BytesIO(rendered)).size == (client_w, round(step.screenshot_size[1] * scale))
    point = np.array(expected_point(step)) * scale
    assert len(marker_pixels(step.screenshot)) == 0  # the stored page has no marker colour: the check can fail
    assert_marker_at(rendered, point, scale)
    with pytest.raises(AssertionError):  # ... and it fails for a point 12 px away
        assert_marker_at(rendered, point + 12 * scale, scale)
    if step.target is not None and step.target.element is not None:  # the target's box: its top edge is orange
        b = step.target.element.bbox
        rgb = np.asarray(Image.open(io.BytesIO(rendered)).convert("RGB")).astype(int)
        y = round(b.y * scale)
        band = rgb[max(y - 1, 0):y + 3, round(b.x * scale):round((b.x + b.width) * scale)]
        orange = (band[..., 0] > 200) & (abs(band[..., 1] - 140) < 40) & (band[..., 2] < 60)
        assert orange.any(axis=0).mean() > 0.5, "no orange frame along the target element's top edge"


def test_marker_follows_pixel_coordinates_and_device_scale():
    # A 2x screenshot of a 160x120 viewport, actions in screenshot pixels, no stored target (so
    # the point comes from Action.coordinate alone).
    base = click_step("t", 0, 1, 0)
    img = Image.open(io.BytesIO(base.screenshot)).resize((320, 240))
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    step = dataclasses.replace(base, screenshot=buf.getvalue(), screenshot_size=(320, 240), coordinates="pixel",
                               action=Action.click(101, 151))
    assert len(marker_pixels(step.screenshot)) == 0
    assert_marker_at(marked_screenshot(step), (101, 151), scale=2.0)
    relative = dataclasses.replace(step, coordinates="relative", action=Action.click(500, 250))
    assert_marker_at(marked_screenshot(relative), (160, 60), scale=2.0)
    no_point = dataclasses.replace(base, action=Action("key", keys=("Enter",)))
    assert marked_screenshot(no_point) == base.screenshot  # nothing to draw: the stored bytes


@pytest.mark.browser
def test_stored_markup_is_shown_as_text_and_never_runs(store, tmp_path):
    # A real attempt with markup in every text field a page shows, written through StoreWriter.
    with TrajectoryStore(store) as reader:
        traj = next(t for t in reader.trajectories() if t.num_steps >= 1)
        real_steps = reader.steps(traj)
    task_id = "miniwob." + PAYLOAD
    rid = request_id(task_id, 0, 1)
    steps = [dataclasses.replace(s, task_id=task_id, seed=0, attempt=1, request_id=rid, title=PAYLOAD,
                                 thought=PAYLOAD, action_text=PAYLOAD, text=PAYLOAD, url="javascript:window.__pwned=3",
                                 exec_error=PAYLOAD) for s in real_steps]
    traj = dataclasses.replace(traj, task_id=task_id, seed=0, attempt=1, request_id=rid, instruction=PAYLOAD,
                               reflections=(PAYLOAD,), verdict=Verdict("failure", reason=PAYLOAD, raw=PAYLOAD),
                               success=False, final_url="javascript:window.__pwned=4", final_answer=PAYLOAD)
    with store_writer(tmp_path / "hostile") as writer:
        writer.add_group([(traj, steps)])
    index = write_viewer([tmp_path / "hostile"], tmp_path / "viewer", labels=[PAYLOAD])

    async def script(page, dialogs):
        await page.goto(index.as_uri())
        await page.select_option("#f-task", task_id)
        assert await page.locator("#episodes tbody tr:visible").count() == 1
        index_text = await page.inner_text("#episodes")
        index_pwned = await page.evaluate("window.__pwned")
        await page.locator("#episodes tbody tr a").click()
        await page.wait_for_selector(".step")
        await page.wait_for_load_state("load")
        return (index_text, index_pwned, await page.evaluate("window.__pwned"), await page.inner_text("h1"),
                await page.locator("pre.action").all_inner_texts(), await page.locator("a[href^='javascript']").count(),
                dialogs)

    index_text, index_pwned, episode_pwned, h1, actions, js_links, dialogs = asyncio.run(_browse(script))
    assert index_pwned is None and episode_pwned is None and not dialogs
    assert task_id in index_text and PAYLOAD in index_text  # the task id and the label, as text
    assert h1.startswith(task_id) and actions == [PAYLOAD] * len(steps) and js_links == 0


def test_command_line_writes_the_viewer_and_bad_arguments_name_the_fix(tmp_path):
    with store_writer(tmp_path / "store") as writer:
        writer.add_group(retry_group("t.a", 0, solved_at=2))
        writer.add_group(retry_group("t.b", 0, solved_at=1))
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "-m", "rmsweb_jax.evaluate.viewer", f"--store={tmp_path / 'store'}",
                           f"--out={out}", "--label=mine", "--max_episodes=2"], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert str(out / "index.html") in done.stdout
    page = (out / "index.html").read_text()
    assert page.count("data-request=") == 2 and "mine" in page  # max_episodes of the store, first in task order
    pages = sorted((out / "episodes").glob("*/*.html"))
    assert len(pages) == 2 and all(p.with_suffix("").is_dir() for p in pages)
    with pytest.raises(ValueError, match="one label per store"):
        write_viewer([tmp_path / "store"], out, labels=["a", "b"])
    with pytest.raises(ValueError, match="at least one store"):
        write_viewer([], out)
