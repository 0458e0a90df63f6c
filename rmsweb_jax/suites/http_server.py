"""A static-file HTTP server on 127.0.0.1 in a background thread (for a suite's own pages)."""
from __future__ import annotations

import functools
import http.server
import pathlib
import threading


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args):  # noqa: A002 — signature fixed by the base class
        pass

    def end_headers(self):
        # Task pages never change while we serve them; let the browser cache scripts.
        self.send_header("Cache-Control", "max-age=3600")
        super().end_headers()


class LocalHTTPServer:
    """Serves `root` on http://127.0.0.1:<port>/ until close().

        with LocalHTTPServer(html_dir) as server:
            server.url("miniwob/click-button.html")
    """

    def __init__(self, root: str | pathlib.Path, port: int = 0, host: str = "127.0.0.1"):
        root = pathlib.Path(root)
        if not root.is_dir():
            raise FileNotFoundError(f"cannot serve {root}: not a folder")
        self.root = root
        self._server = http.server.ThreadingHTTPServer((host, port), functools.partial(_QuietHandler, directory=str(root)))
        self._server.daemon_threads = True
        self.host, self.port = self._server.server_address[:2]
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.2},
                                        name=f"http-{self.port}", daemon=True)
        self._thread.start()

    @property
    def base_url(self) -> str:
        """Returns "http://127.0.0.1:<port>/"."""
        return f"http://{self.host}:{self.port}/"

    @property
    def netloc(self) -> str:
        """Returns "127.0.0.1:<port>" (an allowlist entry)."""
        return f"{self.host}:{self.port}"

    def url(self, path: str) -> str:
        """Returns the URL of `path` under the served folder."""
        return self.base_url + path.lstrip("/")

    def close(self) -> None:
        """Stops serving and frees the port (waits at most 5 s for the thread)."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> "LocalHTTPServer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
