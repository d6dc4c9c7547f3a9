"""Login and logout: the operator token typed once, a signed session cookie after it (`sessions`).

Only with actions on and a token configured (behind an authenticating proxy there is no login). Failed
logins are limited per client and in all (`limits.LoginLimiter`); a logout revokes the session here, so
a copy of its cookie replayed later is no session.

A one-click link (`/login?k=CODE`, `devsched.protocol.login_links`, minted by `devsched up`) logs in too,
once per code, and only on a dashboard that listens on loopback, for a client on this machine: the code
proves the token without carrying it, and is never logged.
"""

from __future__ import annotations

import ipaddress
import logging
import time

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from devsched.protocol import login_links
from devsched.web import revocations, security
from devsched.web.dashboard import Web, client_address, web_of

log = logging.getLogger("devsched.web")


async def login_page(request: Request) -> Response:
    """The login form (only with actions on and a token configured)."""
    web = web_of(request)
    if not web.settings.web_actions or web.token is None:
        raise HTTPException(404, "no login: actions are disabled or handled by a proxy")
    if login_links.PARAM in request.query_params:
        return _link_login(request, web, web.token, request.query_params[login_links.PARAM])
    return web.page(request, "login.html", next=_local(request.query_params.get("next")), failed=False)


async def login(request: Request) -> Response:
    """Check the operator token; on success set the signed session cookie."""
    web = web_of(request)
    form = await web.guard(request)
    if web.token is None or web.sessions is None:
        raise HTTPException(404, "no login: actions are handled by a proxy")
    given = form.get("token")
    target = _local(form.get("next"))
    client = client_address(request)
    wait = web.logins.retry_after(client, time.monotonic())
    if wait is not None:  # the right token too: a guesser learns nothing more while limited
        refused = web.page(request, "login.html", status_code=429, next=target, failed=True, limited=wait)
        refused.headers["retry-after"] = str(wait)
        return refused
    if not isinstance(given, str) or not security.token_ok(web.token, given):
        web.logins.failed(client, time.monotonic())
        log.warning("dashboard login refused")
        return web.page(request, "login.html", status_code=403, next=target, failed=True)
    return _session(request, web, target)


def _link_login(request: Request, web: Web, token: str, code: str) -> Response:
    """Log in with a one-click link's code: loopback only, each code once, failures limited as typed ones."""
    client = client_address(request)
    if not web.settings.loopback or not _is_loopback(client):
        raise HTTPException(403, "login links work only from this machine, on a dashboard listening on loopback")
    now = time.time()
    wait = web.logins.retry_after(client, time.monotonic())
    if wait is not None:
        raise HTTPException(429, f"too many failed logins: try again in {wait} s", {"retry-after": str(wait)})
    checked = login_links.check(token, code, now)
    if checked is None or not _used_codes(request).use(checked, now):
        web.logins.failed(client, time.monotonic())
        log.warning("dashboard login link refused")
        raise HTTPException(
            403,
            "this login link was used already, has expired or is not for this dashboard: "
            "`devsched up` shows a fresh one, or log in with the operator token",
        )
    log.info("dashboard login by link")
    return _session(request, web, "/")


def _session(request: Request, web: Web, target: str) -> Response:
    """The answer to a login that succeeded: the signed session cookie, and on to `target`."""
    web.refuse_unless_sessions_checked()
    assert web.sessions is not None  # a login is offered only with a token
    response = RedirectResponse(target, status_code=303)
    expires = int(time.time() + web.settings.web_session_s)
    response.set_cookie(
        security.SESSION_COOKIE,
        web.sessions.issue(expires),
        max_age=int(web.settings.web_session_s),
        httponly=True,
        samesite="strict",
        secure=web.secure(request),
    )
    return response


def _used_codes(request: Request) -> login_links.UsedCodes:
    """This process's used link codes (one set per application)."""
    used: login_links.UsedCodes | None = getattr(request.app.state, "used_login_codes", None)
    if used is None:
        used = request.app.state.used_login_codes = login_links.UsedCodes()
    return used


def _is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


async def logout(request: Request) -> Response:
    """End the session everywhere: a copy of the cookie replayed later, on any replica, is no session.

    503, and nothing changed, when NATS does not take the revocation (the operator may try again).
    """
    web = web_of(request)
    await web.guard(request)
    cookie = request.cookies.get(security.SESSION_COOKIE)
    if web.sessions is not None and web.revocations is not None:
        ended = web.sessions.ending(cookie, time.time())
        if ended is not None:
            try:
                await web.revocations.publish(ended, time.time())
            except revocations.NotRecorded as exc:
                log.warning("dashboard logout not recorded", extra={"error": str(exc)})
                raise HTTPException(503, "the logout was not recorded (NATS did not take it): log out again") from None
            web.sessions.revoke(cookie, time.time())
            log.info("dashboard logout", extra={"revoked": web.sessions.revoked})
    response = RedirectResponse("/", status_code=303)
    response.delete_cookie(security.SESSION_COOKIE, httponly=True, samesite="strict", secure=web.secure(request))
    return response


def _local(target: object) -> str:
    """A redirect target on this site only (`/path`), else `/`."""
    if isinstance(target, str) and target.startswith("/") and not target.startswith("//") and "\\" not in target:
        return target
    return "/"
