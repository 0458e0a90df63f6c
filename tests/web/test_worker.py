"""BrowserWorker on real Chromium: observations, actions, and the safety rules."""
import time

import pytest

from rmsweb_jax.web.actions import RELATIVE, Action
from rmsweb_jax.web.elements import Element
from rmsweb_jax.web.worker import EpisodeNotRunning

pytestmark = pytest.mark.browser
# Upper bound on waiting for a browser event: only reached when the behaviour under test is broken.
WAIT_S = 30.0
EVENTS = ("dialogs", "blocked_urls", "refused_downloads", "popups")


def find(obs, role: str, name: str) -> Element:
    hits = [e for e in obs.elements if e.role == role and e.name == name]
    assert hits, f"no {role} {name!r} in {[(e.role, e.name) for e in obs.elements]}"
    return hits[0]


def click_on(element: Element, obs) -> Action:
    return Action.click(*RELATIVE.from_css(element.bbox.center, obs.viewport))


def events(loop, worker) -> list:
    return loop.run(worker._guard.active.evaluate("window.events"))


def step_until(loop, worker, action, done, what: str):
    """Returns (observation, seen) once `done(observation, seen)` holds after `action` and then
    0.2 s waits; `seen` joins every step's dialogs, blocked_urls, refused_downloads, popups and
    errors (info["error"] when set). Downloads, popups, blocked requests, scrolls and
    navigations land a moment after the action that caused them, a moment that grows with the
    machine's load: the test waits for the event, not for a fixed time. Fails after WAIT_S."""
    seen = {key: [] for key in (*EVENTS, "errors")}
    deadline = time.monotonic() + WAIT_S
    while True:
        obs, _, info = loop.run(worker.step(action))
        for key in EVENTS:
            seen[key] += getattr(obs, key)
        seen["errors"] += [info["error"]] if info["error"] is not None else []
        if done(obs, seen):
            return obs, seen
        assert time.monotonic() < deadline, f"no {what} within {WAIT_S:g} s of the action; saw {seen}"
        action = Action("wait", seconds=0.2)


def test_observation_has_screenshot_elements_and_focus(loop, live_worker, page_task):
    obs = loop.run(live_worker.reset(page_task("controls.html")))
    assert obs.screenshot[:8] == b"\x89PNG\r\n\x1a\n" and obs.screenshot_size == (640, 480)
    assert obs.url.endswith("/controls.html") and obs.title == "Controls" and obs.step == 0
    assert obs.instruction == "test page controls.html"
    alpha = find(obs, "button", "Alpha one")
    assert (alpha.bbox.x, alpha.bbox.y, alpha.bbox.width, alpha.bbox.height) == (20, 20, 100, 40)
    assert find(obs, "textbox", "Your name").focusable
    assert obs.focused_id is None and obs.last_action is None and obs.last_error is None

    name_box = find(obs, "textbox", "Your name")
    obs, done, info = loop.run(live_worker.step(click_on(name_box, obs)))
    assert not done and info["error"] is None
    assert obs.focused_id == name_box.id and obs.focused.role == "textbox"
    assert obs.last_action.target.element.id == name_box.id

    # Typing without a point goes to the focused field; its target is that field.
    obs, done, info = loop.run(live_worker.step(Action.type_text("  Ada   Lovelace ", press_enter=True)))
    assert info["target"].element.id == name_box.id and info["target"].text == "Ada Lovelace"
    assert find(obs, "textbox", "Your name").value == "  Ada   Lovelace "
    assert events(loop, live_worker)[-1] == "enter:  Ada   Lovelace "
    obs, _, _ = loop.run(live_worker.step(Action.type_text("Grace", clear=True)))
    assert find(obs, "textbox", "Your name").value == "Grace"


def test_pointer_key_scroll_and_wait_actions(loop, live_worker, page_task):
    obs = loop.run(live_worker.reset(page_task("controls.html")))
    beta = find(obs, "button", "Beta")
    obs, _, _ = loop.run(live_worker.step(Action("double_click", coordinate=click_on(beta, obs).coordinate)))
    zone = find(obs, "note", "hover zone")
    obs, _, _ = loop.run(live_worker.step(Action("hover", coordinate=click_on(zone, obs).coordinate)))
    obs, _, info = loop.run(live_worker.step(Action("key", keys=("ctrl", "b"))))
    assert info["target"].keys == "control+b"
    # The wheel scrolls the page asynchronously: wait until the buttons have left the view.
    obs, _ = step_until(loop, live_worker, Action("scroll", direction="down", amount=300),
                        lambda o, _: not any(e.name == "Beta" for e in o.elements)
                        and any(e.startswith("scroll:") for e in events(loop, live_worker)), "scroll")
    log = events(loop, live_worker)
    assert log[:4] == ["beta", "beta", "beta-dbl", "hover"], log
    assert "ctrl+b" in log and any(e.startswith("scroll:") for e in log)
    # The element list follows the scroll: the buttons moved up out of view.
    assert not any(e.name == "Beta" for e in obs.elements)


def test_navigation_go_back_and_answer(loop, live_worker, page_task, page_server):
    obs = loop.run(live_worker.reset(page_task("controls.html")))
    obs, _, info = loop.run(live_worker.step(Action("navigate", url=page_server.url("other.html"))))
    assert info["error"] is None and obs.title == "Other page"
    assert info["target"].url == "http://127.0.0.1:%d/other.html" % page_server.port
    # go_back returns once the navigation commits; the old title follows a moment later.
    obs, seen = step_until(loop, live_worker, Action("go_back"), lambda o, _: o.title == "Controls", "history.back")
    assert seen["errors"] == []
    obs, done, info = loop.run(live_worker.step(Action.answer_with("  42. ")))
    assert done and info["target"].text == "42" and info["reason"] == "answered"
    with pytest.raises(EpisodeNotRunning):
        loop.run(live_worker.step(Action("wait")))


def test_navigation_off_the_allowlist_is_blocked(loop, live_worker, page_task, page_server):
    obs = loop.run(live_worker.reset(page_task("controls.html")))
    off_url = f"http://localhost:{page_server.port}/other.html"
    obs, done, info = loop.run(live_worker.step(Action("navigate", url=off_url)))
    assert not done and "blocked" in info["error"] and "localhost" in info["error"]
    assert obs.title == "Controls"
    # A link to the same page under another host name: the request is blocked and reported,
    # and the worker brings the task page back.
    obs, seen = step_until(loop, live_worker, click_on(find(obs, "link", "Off site"), obs),
                           lambda o, s: off_url in s["blocked_urls"] and s["errors"], "blocked navigation")
    assert seen["blocked_urls"] == [off_url] and [e.startswith("navigation blocked") for e in seen["errors"]] == [True]
    assert obs.title == "Controls" and obs.url.endswith("/controls.html")
    # A same-site link still works.
    obs, seen = step_until(loop, live_worker, click_on(find(obs, "link", "Same site"), obs),
                           lambda o, _: o.title == "Other page", "same-site navigation")
    assert seen["blocked_urls"] == [] and seen["errors"] == []


def test_file_urls_are_refused(loop, live_worker, page_task):
    obs = loop.run(live_worker.reset(page_task("controls.html")))
    obs, _, info = loop.run(live_worker.step(Action("navigate", url="file:///etc/hostname")))
    assert "file://" in info["error"] and obs.title == "Controls"
    obs, seen = step_until(loop, live_worker, click_on(find(obs, "link", "A local file"), obs),
                           lambda o, s: s["blocked_urls"], "refused file:// link")
    assert seen["blocked_urls"] == ["file:///etc/hostname"] and obs.title == "Controls"


def test_dialogs_downloads_and_popups(loop, live_worker, page_task):
    obs = loop.run(live_worker.reset(page_task("controls.html")))
    obs, seen = step_until(loop, live_worker, click_on(find(obs, "button", "Alert"), obs),
                           lambda o, s: s["dialogs"], "dialog")
    assert seen["dialogs"] == ["alert: hello from the page"] and seen["errors"] == []
    obs, _, _ = loop.run(live_worker.step(Action("wait", seconds=0.1)))
    assert obs.dialogs == ()  # reported once

    obs, seen = step_until(loop, live_worker, click_on(find(obs, "link", "Download"), obs),
                           lambda o, s: s["refused_downloads"], "refused download")
    assert seen["refused_downloads"] == ["data:text/plain,hello"]
    assert obs.title == "Controls"

    obs, seen = step_until(loop, live_worker, click_on(find(obs, "link", "Popup"), obs),
                           lambda o, s: s["popups"] and o.title == "Other page", "popup")
    assert len(seen["popups"]) == 1 and obs.title == "Other page"  # the popup is the active page now
    assert len(live_worker._guard.pages) == 2
    # The next episode starts on a single page again.
    obs = loop.run(live_worker.reset(page_task("controls.html")))
    assert obs.title == "Controls" and len(live_worker._guard.pages) == 1
