"""What a task's browser may load: the domain allowlist and the file:// rule (pure)."""
from __future__ import annotations

import dataclasses
import os
import urllib.parse
import urllib.request

# Schemes that never leave the browser.
_LOCAL_SCHEMES = frozenset({"about", "data", "blob"})
_NETWORK_SCHEMES = frozenset({"http", "https", "ws", "wss"})


@dataclasses.dataclass(frozen=True)
class RequestPolicy:
    """Which URLs a task's pages may request.

    `allowed_hosts`: host names (a name admits its subdomains; "host:port" pins the port); None
    admits every http(s) host. `file_roots`: folders whose files file:// may load (a suite's own
    files); every other file:// URL is refused. With `check_subresources` False only documents
    (navigations, frames) are checked, so live sites keep their CDNs.
    """

    allowed_hosts: tuple[str, ...] | None = None
    file_roots: tuple[str, ...] = ()
    check_subresources: bool = True

    def blocked_reason(self, url: str, resource_type: str = "document") -> str | None:
        """Returns why `url` must not load, or None when it may."""
        try:
            parts = urllib.parse.urlsplit(url)
            scheme = parts.scheme.lower()
            if scheme in _LOCAL_SCHEMES:
                return None
            if scheme == "file":
                path = os.path.realpath(urllib.request.url2pathname(parts.path))
                if any(path == root or path.startswith(root.rstrip(os.sep) + os.sep)
                       for root in map(os.path.realpath, self.file_roots)):
                    return None
                return f"file:// outside the suite's files: {url}"
            if scheme not in _NETWORK_SCHEMES:
                return f"scheme {scheme!r} is not allowed: {url}"
            if self.allowed_hosts is None or (resource_type != "document" and not self.check_subresources):
                return None
            host, port = (parts.hostname or "").lower(), parts.port
        except ValueError as e:
            return f"malformed URL {url!r}: {e}"
        for entry in self.allowed_hosts:
            name, _, entry_port = entry.lower().partition(":")
            if (host == name or host.endswith("." + name)) and (not entry_port or str(port) == entry_port):
                return None
        return f"host {host!r} is not on the task's allowlist {list(self.allowed_hosts)}"
