"""What a task's browser may load: the domain allowlist and the file:// rule (pure)."""
from __future__ import annotations

import dataclasses
import os
import urllib.parse
import urllib.request

# Schemes that never leave the browser.
_LOCAL_SCHEMES = frozenset({"about", "data", "blob"})
_NETWORK_SCHEMES = frozenset({"http", "https", "ws", "wss"})
# Internal error pages (a failed load of an allowed URL): nothing was fetched from anywhere.
_ERROR_PAGE_SCHEMES = frozenset({"chrome-error"})
# Port 0 cannot be connected to: every connection sent to this proxy fails at once.
REFUSING_PROXY = "http://127.0.0.1:0"


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

    def context_proxy(self) -> dict[str, str] | None:
        """Returns the Playwright proxy setting that refuses every connection to a host off the
        allowlist (None when sub-resources are not checked or every host is allowed).

        Request interception (the guard's Fetch) never sees WebSocket handshakes; a proxy that
        refuses all connections, bypassed for the allowlist only, stops them in the network
        stack, for every page, frame and worker of the context. `<-loopback>` comes first: it
        drops Chromium's implicit bypass of 127.0.0.0/8 and localhost, which would let any
        local port through.
        """
        if self.allowed_hosts is None or not self.check_subresources:
            return None
        rules = ["<-loopback>"]
        for entry in self.allowed_hosts:
            name, _, port = entry.lower().partition(":")
            suffix = f":{port}" if port else ""
            rules += [f"{name}{suffix}", f"*.{name}{suffix}"]
        return {"server": REFUSING_PROXY, "bypass": ",".join(rules)}

    def blocked_reason(self, url: str, resource_type: str = "document") -> str | None:
        """Returns why `url` must not load, or None when it may."""
        try:
            parts = urllib.parse.urlsplit(url)
            scheme = parts.scheme.lower()
            if scheme in _LOCAL_SCHEMES or scheme in _ERROR_PAGE_SCHEMES:
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
