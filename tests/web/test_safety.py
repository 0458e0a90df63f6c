"""The request policy (pure) and file:// handling on a real page."""
import pathlib

import pytest

from rmsweb_jax.suites.live import LiveSuite
from rmsweb_jax.suites.task import Task
from rmsweb_jax.web.actions import RELATIVE, Action
from rmsweb_jax.web.safety import RequestPolicy
from rmsweb_jax.web.worker import BrowserWorker

PAGES = pathlib.Path(__file__).parent / "pages"


def test_host_allowlist():
    policy = RequestPolicy(allowed_hosts=("example.com", "127.0.0.1:8000"))
    assert policy.blocked_reason("https://example.com/a") is None
    assert policy.blocked_reason("https://shop.example.com:444/a") is None      # subdomain, any port
    assert "allowlist" in policy.blocked_reason("https://badexample.com/")     # not a subdomain
    assert "allowlist" in policy.blocked_reason("https://example.com.evil.io/")
    assert policy.blocked_reason("http://127.0.0.1:8000/x") is None
    assert "allowlist" in policy.blocked_reason("http://127.0.0.1:8001/x")     # pinned port
    assert "allowlist" in policy.blocked_reason("http://localhost:8000/x")
    assert policy.blocked_reason("data:text/html,hi") is None
    assert policy.blocked_reason("about:blank") is None
    assert "scheme 'chrome'" in policy.blocked_reason("chrome://settings")
    # Sub-resources from other hosts load only when the policy does not check them.
    assert "allowlist" in policy.blocked_reason("https://cdn.io/x.js", "script")
    lenient = RequestPolicy(allowed_hosts=("example.com",), check_subresources=False)
    assert lenient.blocked_reason("https://cdn.io/x.js", "script") is None
    assert "allowlist" in lenient.blocked_reason("https://cdn.io/", "document")
    assert RequestPolicy().blocked_reason("https://anything.org/") is None  # the open web


def test_context_proxy_refuses_all_but_the_allowlist_in_strict_mode():
    strict = RequestPolicy(allowed_hosts=("example.com", "127.0.0.1:8000"))
    assert strict.context_proxy() == {
        "server": "http://127.0.0.1:0",
        "bypass": "<-loopback>,example.com,*.example.com,127.0.0.1:8000,*.127.0.0.1:8000"}
    assert RequestPolicy(allowed_hosts=()).context_proxy()["bypass"] == "<-loopback>"  # nothing bypasses
    # Without sub-resource checks (live sites' CDNs) or on the open web: no proxy.
    assert RequestPolicy(allowed_hosts=("example.com",), check_subresources=False).context_proxy() is None
    assert RequestPolicy().context_proxy() is None
    # An internal error page (a failed load) fetched nothing: not a blocked URL.
    assert strict.blocked_reason("chrome-error://chromewebdata/") is None


def test_file_urls_only_under_the_suite_roots(tmp_path):
    (tmp_path / "suite").mkdir()
    policy = RequestPolicy(allowed_hosts=(), file_roots=(str(tmp_path / "suite"),))
    assert policy.blocked_reason(f"file://{tmp_path}/suite/page.html") is None
    assert "file://" in policy.blocked_reason(f"file://{tmp_path}/suite/../secret.txt")
    assert "file://" in policy.blocked_reason(f"file://{tmp_path}/suite-other/page.html")
    assert "file://" in policy.blocked_reason("file:///etc/passwd")
    assert "file://" in RequestPolicy().blocked_reason("file:///etc/passwd")


@pytest.mark.browser
def test_a_suites_own_files_load_and_others_do_not(loop):
    suite = LiveSuite(viewport=(640, 480), settle_s=0.1, file_roots=(str(PAGES),))
    task = Task(suite="test", id="local", start_url=(PAGES / "controls.html").as_uri(), allowed_hosts=())
    worker = BrowserWorker(suite)
    try:
        obs = loop.run(worker.reset(task), 60)
        assert obs.title == "Controls" and obs.url.startswith("file://")
        obs, _, info = loop.run(worker.step(Action("navigate", url=(PAGES / "other.html").as_uri())))
        assert obs.title == "Other page" and info["error"] is None
        obs, _, info = loop.run(worker.step(Action("go_back")))
        obs, _, info = loop.run(worker.step(Action("navigate", url="file:///etc/hostname")))
        assert "file://" in info["error"] and obs.title == "Controls"
        # A link from the suite's file to a file elsewhere: blocked too.
        link = next(e for e in obs.elements if e.name == "A local file")
        obs, _, info = loop.run(worker.step(Action.click(*RELATIVE.from_css(link.bbox.center, obs.viewport))))
        assert "file:///etc/hostname" in obs.blocked_urls and obs.title == "Controls", (obs.url, info)
    finally:
        loop.run(worker.close(), 60)
