"""The dashboard's guards: security headers, CSRF tokens, and the operator's signed session cookie.

- Every response carries a strict Content-Security-Policy (scripts and styles from this origin only, no
  inline code, no framing), `X-Frame-Options: DENY`, `nosniff`, and no referrer sent to other sites.
- CSRF, double-submit: a random token in an HttpOnly, SameSite=Strict cookie, rendered into every form;
  a POST whose form field differs from the cookie is refused (403), and so is one whose `Origin` header
  names another host.
- Login: the operator types the token once (compared in constant time); the answer is a signed session
  cookie (`sessions`). The token itself is never stored in a cookie nor rendered.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from urllib.parse import urlsplit

from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

CSRF_COOKIE = "devsched_csrf"
SESSION_COOKIE = "devsched_session"
CSRF_FIELD = "csrf"
_CSRF_SHAPE = re.compile(r"[A-Za-z0-9_-]{43}")

CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
SECURITY_HEADERS = {
    "content-security-policy": CONTENT_SECURITY_POLICY,
    "x-frame-options": "DENY",
    "x-content-type-options": "nosniff",
    "referrer-policy": "same-origin",  # not no-referrer: Chromium then sends `Origin: null` on our own POSTs
    "cross-origin-opener-policy": "same-origin",
    "cross-origin-resource-policy": "same-origin",
}


class SecurityHeaders:
    """ASGI middleware adding `SECURITY_HEADERS` to every HTTP response (and no-store to pages)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Pass the request on; add the headers to its response."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in SECURITY_HEADERS.items():
                    headers[name] = value
                if not scope["path"].startswith("/static/"):
                    headers["cache-control"] = "no-store"
            await send(message)

        await self.app(scope, receive, with_headers)


def new_csrf_token() -> str:
    """A fresh random CSRF token."""
    return secrets.token_urlsafe(32)


def csrf_cookie(value: str | None) -> str | None:
    """The CSRF cookie if it has the shape of one this service makes, else None (a new one is set)."""
    return value if value is not None and _CSRF_SHAPE.fullmatch(value) else None


def csrf_ok(cookie: str | None, submitted: str | None) -> bool:
    """Whether the form's token matches the cookie's (both present, compared in constant time)."""
    if not cookie or not submitted:
        return False
    return hmac.compare_digest(cookie.encode(errors="replace"), submitted.encode(errors="replace"))


def same_origin(origin: str | None, host: str | None) -> bool:
    """Whether an `Origin` header is absent or names `host` (the request's `Host`)."""
    if origin is None:
        return True
    if origin == "null" or host is None:
        return False
    try:
        return urlsplit(origin).netloc.lower() == host.lower()
    except ValueError:  # not a URL (an unclosed `[`, ...)
        return False


def token_ok(expected: str, given: str) -> bool:
    """Whether the typed token is the operator token, in constant time.

    Digests of equal length are compared, so not even the token's length shows in the time taken.
    """
    return hmac.compare_digest(_digest(expected), _digest(given))


def _digest(text: str) -> bytes:
    return hashlib.sha256(text.encode(errors="replace")).digest()
