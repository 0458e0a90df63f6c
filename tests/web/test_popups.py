"""The allowlist holds against every way a page can reach another host (real Chromium, two real
servers): the task's server on 127.0.0.1 and an off-allowlist server on 127.0.0.2 that records
every request it receives, WebSocket upgrades and EventSource streams included.

Each attack is a page whose one big button makes the request; the agent clicks it. The test
then waits until the attempt has played out (the off host recorded it, the guard reported it
blocked, or the page saw it fail) and checks that 0 requests reached the off host and that the
page the agent sees is still the task's. Every test runs twice: on a Chromium the worker launches, and on a
remote one driven over CDP (web.cdp_endpoint), where the guard's interceptor and the strict mode's proxy must
hold the same.
"""
import http.server
import threading
import time
import urllib.request

import pytest

from rmsweb_jax.suites.live import LiveSuite
from rmsweb_jax.suites.task import Task
from rmsweb_jax.web.actions import Action
from rmsweb_jax.web.worker import BrowserWorker, WorkerConfig
from tests.web.remote_chromium import RemoteChromium, free_port

pytestmark = pytest.mark.browser
SETTLE_TIMEOUT_S = 10.0


class _Server:
    """An HTTP server on `host` in a thread; `handler(request) -> (status, headers, body)`.
    Every request's (path, Upgrade header) is kept in `requests`."""

    def __init__(self, host, handler):
        self.requests, self._lock = [], threading.Lock()
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                with server._lock:
                    server.requests.append((self.path, self.headers.get("Upgrade")))
                status, headers, body = handler(self)
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_POST = do_GET

        self._httpd = http.server.ThreadingHTTPServer((host, 0), Handler)
        self._httpd.daemon_threads = True
        self.netloc = f"{host}:{self._httpd.server_address[1]}"
        self.base = f"http://{self.netloc}"
        threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True).start()

    def seen(self):
        with self._lock:
            return list(self.requests)

    def close(self):
        self._httpd.shutdown()
        self._httpd.server_close()


def _html(title, body=""):
    return f"<!doctype html><html><head><title>{title}</title></head><body style='margin:0'>{body}</body></html>"


def _attacks(off, ws):
    """Returns {name: JavaScript run by the button} for each way out."""
    return {
        "location": f"location.href = '{off}/location'",
        "form": "document.getElementById('f').submit()",
        "redirect": "location.href = '/redirect'",
        "iframe": f"document.body.appendChild(Object.assign(document.createElement('iframe'), {{src: '{off}/iframe'}}))",
        "meta_refresh": "location.href = '/meta'",
        "window_open": f"window.open('{off}/window_open')",
        "window_open_blank": f"const w = window.open('about:blank'); w.location.href = '{off}/window_open_blank'",
        "target_blank": "document.getElementById('a').click()",
        "img": f"document.body.appendChild(Object.assign(new Image(), {{src: '{off}/img', onerror: done}}))",
        "fetch": f"fetch('{off}/fetch').then(done, done)",
        "xhr": f"const x = new XMLHttpRequest(); x.onloadend = done; x.open('GET', '{off}/xhr'); x.send()",
        "websocket": f"const s = new WebSocket('{ws}/websocket'); s.onerror = s.onclose = done",
        "eventsource": f"const e = new EventSource('{off}/eventsource'); e.onerror = () => {{ e.close(); done(); }}",
        "worker_websocket": (f"const w = new Worker(URL.createObjectURL(new Blob([\"const s = new WebSocket('{ws}/worker');"
                             " s.onerror = s.onclose = () => postMessage(1)\"]))); w.onmessage = done"),
    }


DOCUMENT_ATTACKS = ("location", "form", "redirect", "iframe", "meta_refresh", "window_open", "window_open_blank",
                    "target_blank")
SUBRESOURCE_ATTACKS = ("img", "fetch", "xhr", "websocket", "eventsource", "worker_websocket")


@pytest.fixture(scope="module")
def servers():
    off = _Server("127.0.0.2", lambda r: (200, {"Content-Type": "text/html"}, _html("Off host").encode()))
    attacks = _attacks(off.base, "ws://" + off.netloc)

    def home_page(request):
        path = request.path.split("?")[0]
        if path == "/redirect":
            return 302, {"Location": f"{off.base}/redirect"}, b""
        if path == "/meta":
            return 200, {"Content-Type": "text/html"}, _html(
                "Meta", f"<meta http-equiv='refresh' content='0;url={off.base}/meta_refresh'>").encode()
        name = path.rsplit("/", 1)[-1]
        if name not in attacks:
            return 404, {}, b""
        body = (f"<form id='f' action='{off.base}/form' method='get'><input name='q' value='1'></form>"
                f"<a id='a' href='{off.base}/target_blank' target='_blank'>out</a>"
                "<button id='go' style='position:fixed;left:0;top:0;width:100%;height:100%'>Go</button>"
                "<script>function done() { document.title = 'done'; }\n"
                f"document.getElementById('go').onclick = () => {{ {attacks[name]} }};</script>")
        return 200, {"Content-Type": "text/html"}, _html("Attack", body).encode()

    home = _Server("127.0.0.1", home_page)
    # Both hosts answer a direct request: the recording works, nothing blocks them outside the browser.
    urllib.request.urlopen(f"{off.base}/probe", timeout=10).read()
    assert off.seen() == [("/probe", None)]
    off.requests.clear()
    yield home, off
    home.close()
    off.close()


def _worker(loop, strict, endpoint=None):
    worker = BrowserWorker(LiveSuite(viewport=(400, 300), settle_s=0.05, check_subresources=strict),
                           WorkerConfig(step_timeout_s=20, navigation_timeout_s=10,
                                        cdp_endpoints=(endpoint,) if endpoint else ()))
    loop.run(worker.start(), 120)
    return worker


@pytest.fixture(scope="module")
def remote_browser(tmp_path_factory):
    """A Chromium the test starts with --remote-debugging-port (web.cdp_endpoint): the guard must hold there too.
    The default and the strict worker share it, open at once, as a pool's workers share an endpoint: each guard
    must judge its own context's requests only (one policy's refusals and log never land on the other)."""
    browser = RemoteChromium(free_port(), tmp_path_factory.mktemp("remote") / "profile")
    browser.start()
    yield browser
    browser.kill()


@pytest.fixture(scope="module", params=["local", "remote"])
def where(request):
    """Where the guarded browsers run: launched by the worker, or a remote Chromium over CDP."""
    return request.getfixturevalue("remote_browser").http if request.param == "remote" else None


@pytest.fixture(scope="module")
def default_worker(loop, where):
    worker = _worker(loop, strict=False, endpoint=where)
    yield worker
    loop.run(worker.close(), 60)


@pytest.fixture(scope="module")
def strict_worker(loop, where):
    worker = _worker(loop, strict=True, endpoint=where)
    yield worker
    loop.run(worker.close(), 60)


def _attack(loop, worker, servers, name, allowed=True, titles=None):
    """Runs attack `name` and returns (requests the off host got, urls the agent saw, blocked urls).
    With a list `titles`, it also waits until the page has seen its request fail (its title turns
    'done') and appends every title the agent saw to it."""
    home, off = servers
    off.requests.clear()
    task = Task(suite="test", id=name, start_url=f"{home.base}/attack/{name}", instruction=name,
                allowed_hosts=(home.netloc,) if allowed else None)
    obs = loop.run(worker.reset(task), 60)
    assert obs.title == "Attack", obs.url
    urls, blocked = [], []
    obs, _, info = loop.run(worker.step(Action.click(500, 500)), 60)
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    while True:
        urls.append(obs.url)
        blocked.extend(obs.blocked_urls)
        if titles is not None:
            titles.append(obs.title)
        played_out = (off.seen() or obs.title == "done" or any(u.startswith(off.base) for u in blocked))
        if titles is not None:
            played_out = obs.title == "done"
        if played_out or time.monotonic() > deadline:
            break
        obs, _, info = loop.run(worker.step(Action("wait", seconds=0.2)), 60)
    # One more observation after the attempt played out: nothing arrives late, nothing moved.
    obs, _, _ = loop.run(worker.step(Action("wait", seconds=0.3)), 60)
    urls.append(obs.url)
    blocked.extend(obs.blocked_urls)
    if titles is not None:
        titles.append(obs.title)
    return off.seen(), urls, blocked


def test_the_off_host_records_what_an_unguarded_page_sends(loop, default_worker, servers):
    # With the open web allowed, the popup's request arrives: the recording server sees attacks.
    seen, _, _ = _attack(loop, default_worker, servers, "window_open", allowed=False)
    assert ("/window_open", None) in seen


@pytest.mark.parametrize("name", DOCUMENT_ATTACKS)
@pytest.mark.parametrize("strict", [False, True], ids=["default", "strict"])
def test_no_document_request_reaches_an_off_allowlist_host(loop, default_worker, strict_worker, servers, name, strict):
    home, off = servers
    seen, urls, blocked = _attack(loop, strict_worker if strict else default_worker, servers, name)
    assert seen == [], f"{name}: the off host got {seen}"
    assert any(u.startswith(off.base) for u in blocked), (name, blocked)
    # After every step the agent's page is the task's own page, never a popup off the allowlist.
    assert all(u.startswith(home.base) for u in urls), (name, urls)


@pytest.mark.parametrize("name", SUBRESOURCE_ATTACKS)
def test_no_subresource_request_reaches_an_off_allowlist_host_in_strict_mode(loop, strict_worker, servers, name):
    home, off = servers
    titles = []
    seen, urls, blocked = _attack(loop, strict_worker, servers, name, titles=titles)
    assert seen == [], f"{name}: the off host got {seen}"
    assert all(u.startswith(home.base) for u in urls), (name, urls)
    # The attack fired: the page's request was answered with a failure (its error handler set the
    # title), and every request the interceptor sees (all but WebSocket handshakes, which the
    # proxy refuses) was reported blocked. The default-mode test below shows the same page's
    # request reaching the off host.
    assert "done" in titles, (name, titles)
    if "websocket" not in name:
        assert f"{off.base}/{name}" in blocked, (name, blocked)


def test_the_default_mode_lets_subresources_through(loop, default_worker, servers):
    # Live sites keep their CDNs: without check_subresources an image from another host loads.
    seen, _, _ = _attack(loop, default_worker, servers, "img")
    assert ("/img", None) in seen


@pytest.mark.parametrize("name", SUBRESOURCE_ATTACKS)
def test_every_subresource_attack_reaches_the_off_host_in_default_mode(loop, default_worker, servers, name):
    # The strict test's attacks are real: unguarded, each one's request arrives at the off host.
    seen, _, _ = _attack(loop, default_worker, servers, name)
    path = "/worker" if name == "worker_websocket" else f"/{name}"
    assert path in [p for p, _ in seen], (name, seen)
