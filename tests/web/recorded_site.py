"""A small site for record/replay tests, served on 127.0.0.1 by the test: several pages, fetch and XHR,
an image, a redirect, a cookie, a form POST, a server-side and a page-side clock; every request the
server answers is logged (`hits`), so a test can check that a replay never reached it.

Each page sets its title to "ready:<page>" once its fetch, XHR and image have all landed; the site's
policy (`site_policy`) waits until two observations in a row show that title before it acts, so the
observations it acts on are complete whatever the timing.
"""
from __future__ import annotations

import http.server
import io
import json
import threading
import time
import urllib.parse

from PIL import Image, ImageDraw

from rmsweb_jax.suites.live import LiveSuite
from rmsweb_jax.suites.task import Task
from rmsweb_jax.web.actions import RELATIVE, Action
from rmsweb_jax.web.suite import EpisodeStatus

_READY = """<script>
  let pending = 3;
  function done() { if (--pending === 0) document.title = 'ready:__NAME__'; }
  fetch('/api/data?page=__NAME__').then(r => r.json()).then(d => {
    document.getElementById('fetched').textContent = 'fetched ' + d.value + ' at ' + d.served_at; done(); });
  const xhr = new XMLHttpRequest();
  xhr.open('GET', '/api/xhr'); xhr.onload = () => {
    document.getElementById('xhr').textContent = 'xhr ' + xhr.responseText; done(); };
  xhr.send();
  document.getElementById('clock').textContent = 'page clock ' + new Date().toISOString();
  localStorage.setItem('visits', String(Number(localStorage.getItem('visits') || 0) + 1));
</script>"""


def _page(name: str, body: str) -> bytes:
    return f"""<!doctype html><html><head><title>loading</title></head><body style="font:16px sans-serif">
<h1>{name}</h1>{body}
<p id="fetched">fetch pending</p><p id="xhr">xhr pending</p><p id="clock"></p>
<img src="/img.png?page={name}" width="64" height="32" alt="badge" onload="this.decode().then(() => requestAnimationFrame(() => requestAnimationFrame(done)))">
{_READY.replace('__NAME__', name)}</body></html>""".encode()


def _png(text: str) -> bytes:
    image = Image.new("RGB", (64, 32), (30, 90, 160))
    ImageDraw.Draw(image).text((4, 10), text, fill=(255, 255, 255))
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return buf.getvalue()


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format, *args):  # noqa: A002 — signature fixed by the base class
        pass

    def _send(self, body: bytes, kind: str = "text/html", status: int = 200, headers: dict | None = None):
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):  # noqa: N802 — http.server's name
        self.server.hits.append(("GET", self.path))
        url = urllib.parse.urlsplit(self.path)
        cookie = self.headers.get("Cookie", "")
        if url.path == "/":
            self._send(_page("index", '<a href="/go">Form</a>'), headers={"Set-Cookie": "visitor=alice; Path=/"})
        elif url.path == "/go":
            self._send(b"", status=302, headers={"Location": "/form"})
        elif url.path == "/form":
            self._send(_page("form", f'<p>cookie [{cookie}]</p><form method="post" action="/submit">'
                                     '<input name="word" value="hello"><button type="submit">Send</button></form>'))
        elif url.path == "/never":
            self._send(_page("never", "<p>never recorded</p>"))
        elif url.path == "/api/data":
            # the server's clock: a replay must answer with the recorded instant, not a new one
            self._send(json.dumps({"value": 42, "served_at": f"{time.time():.6f}"}).encode(), "application/json")
        elif url.path == "/api/xhr":
            self._send(b"pong", "text/plain")
        elif url.path == "/img.png":
            self._send(_png(urllib.parse.parse_qs(url.query).get("page", ["?"])[0]), "image/png")
        else:
            self._send(b"not found", "text/plain", status=404)

    def do_POST(self):  # noqa: N802 — http.server's name
        self.server.hits.append(("POST", self.path))
        data = self.rfile.read(int(self.headers.get("Content-Length", 0))).decode()
        word = urllib.parse.parse_qs(data).get("word", [""])[0]
        self._send(_page("result", f'<p id="word" data-word="{word}">you sent {word}</p>'
                                   '<a href="/never">More</a>'))


class RecordedSite:
    """Serves the site on 127.0.0.1 (`port` 0: any free one) until close(); `hits` lists (method, path)
    of every request answered."""

    def __init__(self, port: int = 0):
        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", port), _Handler)
        self._server.daemon_threads = True
        self._server.hits = []
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
        self._thread.start()

    @property
    def hits(self) -> list:
        return self._server.hits

    @property
    def netloc(self) -> str:
        return f"127.0.0.1:{self.port}"

    def task(self) -> Task:
        return Task(suite="test", id="recorded-site", start_url=f"http://{self.netloc}/",
                    instruction="send the form", allowed_hosts=(self.netloc,))

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class SiteSuite(LiveSuite):
    """The live suite with a reward: 1 once the result page shows the word sent."""

    status_script = "document.getElementById('word') ? document.getElementById('word').dataset.word : null"

    def status(self, task, value, answer):
        if answer is not None:
            return EpisodeStatus(done=True, reward=float(value == "hello"), success=value == "hello", reason="answered")
        return EpisodeStatus(done=False)


def _click(obs, role: str, name: str) -> Action:
    hits = [e for e in obs.elements if e.role == role and e.name == name]
    assert hits, f"no {role} {name!r} on {obs.url}: {[(e.role, e.name) for e in obs.elements]}"
    return Action.click(*RELATIVE.from_css(hits[0].bbox.center, obs.viewport))


def site_policy(off_record: bool = False):
    """Returns a policy (History -> Action) that follows the form to its result and answers; with
    `off_record` it first follows the result page's "More" link, which no recording holds."""
    clicked_more, acted = [], set()

    def policy(history) -> Action:
        obs = history.observation
        if clicked_more:  # the page "More" asked for was refused: nothing more to see
            return Action.answer_with("sent")
        # A title read together with the accessibility tree and the screenshot may run ahead of them
        # (read_page sends the four requests at once): act once the page was ready one observation ago.
        if len(history.observations) < 2 or not all(o.title == obs.title and o.title.startswith("ready:")
                                                    for o in history.observations[-2:]):
            return Action("wait", seconds=0.1)
        page = obs.title.split(":", 1)[1]
        run = (history.request.request_id, history.attempt, page)
        if run in acted:  # the page acted on is still shown: its navigation has not landed yet
            return Action("wait", seconds=0.1)
        acted.add(run)
        if page == "index":
            return _click(obs, "link", "Form")
        if page == "form":
            return _click(obs, "button", "Send")
        if page == "result" and off_record:
            clicked_more.append(True)
            return _click(obs, "link", "More")
        return Action.answer_with("sent")
    return policy
