"""The `Host` allowlist: a page on another site cannot reach the dashboard by DNS rebinding.

A site whose name the attacker re-points at 127.0.0.1 (or at the dashboard's address) makes the browser
send requests to the dashboard as same-origin requests of *that site*: its scripts could then read every
page, log and artifact. Such a request still names the attacker's site in its `Host` header, so only the
names the dashboard is meant to be reached by are served; any other `Host` is answered 400 before any page
or stream runs.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from starlette.types import ASGIApp, Receive, Scope, Send

#: The names a loopback dashboard is reached by (a browser on the same machine, a port-forward).
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "[::1]")
#: Wildcard binds: no name of their own.
ANY_ADDRESS = ("0.0.0.0", "::", "")


@dataclass(frozen=True, slots=True)
class Allowed:
    """One allowed `Host`: a name (`*.domain` for its subdomains, `*` for any) and a port (None: any)."""

    name: str
    port: int | None = None

    def matches(self, name: str, port: int) -> bool:
        """Whether `name:port` is this entry."""
        if self.port is not None and port != self.port:
            return False
        if self.name == "*":
            return True
        if self.name.startswith("*."):
            return name.endswith(self.name[1:]) and len(name) > len(self.name) - 1
        return name == self.name


def split_host(value: str) -> tuple[str, int | None] | None:
    """`(name, port)` of a `Host` header (lower case, IPv6 in brackets), or None when it is no host."""
    value = value.strip().lower()
    if not value or len(value) > 300 or not value.isascii() or any(c in value for c in "/\\@ \t?#"):
        return None
    if value.startswith("["):
        name, bracket, rest = value.partition("]")
        name += bracket
        if not bracket or (rest and not rest.startswith(":")):
            return None
        port_text = rest[1:] if rest else None
    else:
        name, colon, port_text_or_empty = value.partition(":")
        port_text = port_text_or_empty if colon else None
        if ":" in port_text_or_empty:
            return None
    if port_text is None:
        return (name, None) if name else None
    if not port_text.isdigit() or not port_text.isascii() or not 0 < int(port_text) < 65536:
        return None
    return (name, int(port_text)) if name else None


def parse(text: str) -> list[Allowed]:
    """The entries of `DEVSCHED_WEB_ALLOWED_HOSTS` (comma-separated); ValueError naming a bad one."""
    entries = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        if item == "*":
            entries.append(Allowed("*"))
            continue
        found = split_host(item)
        if found is None:
            raise ValueError(f"DEVSCHED_WEB_ALLOWED_HOSTS: entry {len(entries) + 1} is not a host[:port]")
        entries.append(Allowed(*found))
    if not entries:
        raise ValueError("DEVSCHED_WEB_ALLOWED_HOSTS is empty")
    return entries


def _bracketed(address: str) -> str:
    try:
        return f"[{address}]" if ipaddress.ip_address(address).version == 6 else address
    except ValueError:
        return address


def default(bind: str, port: int, *, loopback: bool) -> list[Allowed]:
    """Who is served without the setting.

    A loopback bind: the bind address and the loopback names, with the port. Any other bind: those names
    with any port (a port-forward), and nothing else until `DEVSCHED_WEB_ALLOWED_HOSTS` names more.
    """
    names = [_bracketed(bind.lower()), *LOOPBACK_NAMES]
    if loopback:
        return [Allowed(name, port) for name in dict.fromkeys(names)]
    return [Allowed(name) for name in dict.fromkeys(names) if name not in ANY_ADDRESS]


def allowed(entries: list[Allowed], host: str | None, scheme: str) -> bool:
    """Whether a request with this `Host` header is served."""
    found = split_host(host) if host is not None else None
    if found is None:
        return False
    name, port = found
    if port is None:
        port = 443 if scheme in ("https", "wss") else 80
    return any(entry.matches(name, port) for entry in entries)


class HostAllowlist:
    """ASGI middleware: 400 for a request whose `Host` is not allowed (the value is not echoed or logged)."""

    def __init__(self, app: ASGIApp, entries: list[Allowed]) -> None:
        self.app = app
        self.entries = entries

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Refuse, or pass the request on."""
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        host = next((v.decode("latin-1") for k, v in scope["headers"] if k == b"host"), None)
        if allowed(self.entries, host, scope.get("scheme", "http")):
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        body = b"unknown Host header: this dashboard answers only the names in DEVSCHED_WEB_ALLOWED_HOSTS\n"
        await send(
            {
                "type": "http.response.start",
                "status": 400,
                "headers": [
                    (b"content-type", b"text/plain; charset=utf-8"),
                    (b"content-length", str(len(body)).encode()),
                    (b"cache-control", b"no-store"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})
