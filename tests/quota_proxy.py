"""A proxy on 127.0.0.1 in front of the GCS emulator (tests/storage_emulator.py) that refuses uploads of objects
whose name holds a given part with the error a bucket's project gives past a quota: HTTP 403, reason
"quotaExceeded". Everything else goes through unchanged."""
from __future__ import annotations

import http.server
import json
import threading
import urllib.error
import urllib.parse
import urllib.request

QUOTA_ERROR = {"error": {"code": 403, "message": "Quota exceeded for quota metric 'storage bytes' of the project.",
                         "errors": [{"reason": "quotaExceeded", "domain": "usageLimits",
                                     "message": "Quota exceeded for quota metric 'storage bytes' of the project."}]}}


class QuotaProxy:
    """`with QuotaProxy(emulator_url, refused="checkpoints/") as url:` the proxy's URL, while it runs."""

    def __init__(self, upstream: str, refused: str):
        self.upstream, self.refused, self.refusals = upstream.rstrip("/"), refused, 0
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _forward(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.command in ("POST", "PUT") and proxy._refuses(self.path, body):
                    proxy.refusals += 1
                    return self._reply(403, {"Content-Type": "application/json"}, json.dumps(QUOTA_ERROR).encode())
                request = urllib.request.Request(proxy.upstream + self.path, data=body or None, method=self.command,
                                                 headers={k: v for k, v in self.headers.items() if k.lower() != "host"})
                try:
                    with urllib.request.urlopen(request, timeout=60) as reply:
                        self._reply(reply.status, dict(reply.headers), reply.read())
                except urllib.error.HTTPError as err:
                    self._reply(err.code, dict(err.headers), err.read())

            def _reply(self, status, headers, body):
                self.send_response(status)
                for k, v in headers.items():
                    if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = _forward

        class Server(http.server.ThreadingHTTPServer):
            def handle_error(self, request, client_address):
                pass  # a client that hung up on a refusal: nothing to tell

        self.server = Server(("127.0.0.1", 0), Handler)

    def _refuses(self, path: str, body: bytes) -> bool:
        query = urllib.parse.parse_qs(urllib.parse.urlsplit(path).query)
        names = query.get("name", []) + [urllib.parse.unquote(path)]
        head = body[:4096].decode("latin-1")  # a multipart upload names its object in the first part
        return any(self.refused in name for name in names) or '"name"' in head and self.refused in head

    def __enter__(self) -> str:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
