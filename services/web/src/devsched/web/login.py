"""Login and logout: the operator token typed once, a signed session cookie after it (`sessions`).

Only with actions on and a token configured (behind an authenticating proxy there is no login). Failed
logins are limited per client and in all (`limits.LoginLimiter`); a logout revokes the session here, so
a copy of its cookie replayed later is no session.
"""

from __future__ import annotations

import logging
import time

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from devsched.web import revocations, security
from devsched.web.dashboard import client_address, web_of

log = logging.getLogger("devsched.web")


async def login_page(request: Request) -> Response:
    """The login form (only with actions on and a token configured)."""
    web = web_of(request)
    if not web.settings.web_actions or web.token is None:
        raise HTTPException(404, "no login: actions are disabled or handled by a proxy")
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
    web.refuse_unless_sessions_checked()
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
