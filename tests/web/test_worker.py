"""BrowserWorker on real Chromium: observations, actions, and the safety rules."""
import pytest

from rmsweb_jax.web.actions import RELATIVE, Action
from rmsweb_jax.web.elements import Element
from rmsweb_jax.web.worker import EpisodeNotRunning

pytestmark = pytest.mark.browser


def find(obs, role: str, name: str) -> Element:
    hits = [e for e in obs.elements if e.role == role and e.name == name]
    assert hits, f"no {role} {name!r} in {[(e.role, e.name) for e in obs.elements]}"
    return hits[0]


def click_on(element: Element, obs) -> Action:
    return Action.click(*RELATIVE.from_css(element.bbox.center, obs.viewport))


def events(loop, worker) -> list:
    return loop.run(worker._guard.active.evaluate("window.events"))


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
    obs, _, _ = loop.run(live_worker.step(Action("scroll", direction="down", amount=300)))
    obs, _, _ = loop.run(live_worker.step(Action("wait", seconds=0.2)))
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
    obs, _, info = loop.run(live_worker.step(Action("go_back")))
    assert obs.title == "Controls", info
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
    obs, _, info = loop.run(live_worker.step(click_on(find(obs, "link", "Off site"), obs)))
    assert off_url in obs.blocked_urls and "navigation blocked" in info["error"]
    assert obs.title == "Controls" and obs.url.endswith("/controls.html")
    # A same-site link still works.
    obs, _, info = loop.run(live_worker.step(click_on(find(obs, "link", "Same site"), obs)))
    assert obs.title == "Other page" and not obs.blocked_urls


def test_file_urls_are_refused(loop, live_worker, page_task):
    obs = loop.run(live_worker.reset(page_task("controls.html")))
    obs, _, info = loop.run(live_worker.step(Action("navigate", url="file:///etc/hostname")))
    assert "file://" in info["error"] and obs.title == "Controls"
    obs, _, info = loop.run(live_worker.step(click_on(find(obs, "link", "A local file"), obs)))
    assert "file:///etc/hostname" in obs.blocked_urls and obs.title == "Controls"


def test_dialogs_downloads_and_popups(loop, live_worker, page_task):
    obs = loop.run(live_worker.reset(page_task("controls.html")))
    obs, _, info = loop.run(live_worker.step(click_on(find(obs, "button", "Alert"), obs)))
    assert obs.dialogs == ("alert: hello from the page",) and info["error"] is None
    obs, _, _ = loop.run(live_worker.step(Action("wait", seconds=0.1)))
    assert obs.dialogs == ()  # reported once

    obs, _, _ = loop.run(live_worker.step(click_on(find(obs, "link", "Download"), obs)))
    if not obs.refused_downloads:  # the download event can trail the click by a moment
        obs, _, _ = loop.run(live_worker.step(Action("wait", seconds=0.3)))
    assert obs.refused_downloads == ("data:text/plain,hello",)
    assert obs.title == "Controls"

    obs, _, _ = loop.run(live_worker.step(click_on(find(obs, "link", "Popup"), obs)))
    popups = obs.popups
    if obs.title != "Other page":
        obs, _, _ = loop.run(live_worker.step(Action("wait", seconds=0.5)))
        popups += obs.popups
    assert len(popups) == 1 and obs.title == "Other page"  # the popup is the active page now
    assert len(live_worker._guard.pages) == 2
    # The next episode starts on a single page again.
    obs = loop.run(live_worker.reset(page_task("controls.html")))
    assert obs.title == "Controls" and len(live_worker._guard.pages) == 1
