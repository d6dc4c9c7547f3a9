"""One-click login links of the dashboard: `http://127.0.0.1:PORT/login?k=CODE`, each good once, for minutes.

Whoever holds the operator token (`devsched up`, which made it) mints a code; the dashboard checks it with
the same token and, if the code is well signed, unexpired and not used before, starts a session as a typed
login would. The token itself never travels in a URL (URLs land in browser history and terminal scrollback):
a code is `<nonce>.<expiry>.<mac>`, the MAC keyed by a hash of the token, so a code proves the token
without revealing it, and a leaked one is worthless once used or past its expiry. Short enough that a whole
link fits on one line of an 80-column terminal.

Both sides use this one definition; the clock is the caller's (`now`, seconds since the epoch).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass

#: Seconds a code stays good (once).
LINK_S = 600
#: The query parameter of `/login` that carries a code.
PARAM = "k"

_SHAPE = re.compile(r"([A-Za-z0-9_-]{12})\.([0-9a-z]{1,8})\.([A-Za-z0-9_-]{22})")


def _key(token: str) -> bytes:
    return hashlib.sha256(b"devsched-web login link v1\0" + token.encode()).digest()


def _mac(token: str, nonce: str, expiry: str) -> str:
    digest = hmac.new(_key(token), f"{nonce}.{expiry}".encode(), hashlib.sha256).digest()[:16]
    return base64.urlsafe_b64encode(digest).decode().rstrip("=")


def _base36(n: int) -> str:
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    out = ""
    while True:
        n, r = divmod(n, 36)
        out = digits[r] + out
        if not n:
            return out


@dataclass(frozen=True, slots=True)
class Code:
    """A checked code: its nonce (what "used once" remembers) and when it expires."""

    nonce: str
    expires_at: int


def mint(token: str, now: float, lifetime_s: int = LINK_S) -> str:
    """A new code for the dashboard of `token`, good once until `now + lifetime_s`."""
    nonce = secrets.token_urlsafe(9)
    expiry = _base36(int(now) + lifetime_s)
    return f"{nonce}.{expiry}.{_mac(token, nonce, expiry)}"


def link(base_url: str, code: str) -> str:
    """The login link of `code` on the dashboard at `base_url` (`http://127.0.0.1:8642/`)."""
    return f"{base_url.rstrip('/')}/login?{PARAM}={code}"


def check(token: str, code: object, now: float) -> Code | None:
    """The code if it is well formed, signed with `token` and unexpired, else None (whatever it holds)."""
    if not isinstance(code, str) or len(code) > 64:
        return None
    shape = _SHAPE.fullmatch(code)
    if shape is None:
        return None
    nonce, expiry, mac = shape.groups()
    if not hmac.compare_digest(_mac(token, nonce, expiry).encode(), mac.encode()):
        return None
    expires_at = int(expiry, 36)
    return Code(nonce, expires_at) if expires_at > now else None


class UsedCodes:
    """The nonces of codes used already, each kept until its code expires (then it is refused anyway)."""

    def __init__(self) -> None:
        self._nonces: dict[str, int] = {}

    def use(self, code: Code, now: float) -> bool:
        """Mark `code` used; False if it was used before (a second use is refused)."""
        for expired in [n for n, expiry in self._nonces.items() if expiry <= now]:
            del self._nonces[expired]
        if code.nonce in self._nonces:
            return False
        self._nonces[code.nonce] = code.expires_at
        return True
