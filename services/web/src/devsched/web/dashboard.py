"""The dashboard's state, shared by every page, live stream and action: `Web`, and the request helpers.

`Web` holds the settings, the API client, the sampler, the templates, the operator's sessions and the
limiters, and two caches that make a page's cost not grow with its viewers: fragments rendered once per
snapshot (`cached`), and scheduler reads made once per snapshot for every live stream that asks
(`shared`).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Awaitable, Callable, Hashable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.datastructures import FormData
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse

from devsched.client import Client
from devsched.web import limits, revocations, security, sessions, views
from devsched.web.sampler import Sampler
from devsched.web.settings import WebSettings

HERE = Path(__file__).parent


def _templates() -> Environment:
    env = Environment(
        loader=FileSystemLoader(HERE / "templates"),
        autoescape=select_autoescape(default=True, default_for_string=True),
        trim_blocks=True,
        lstrip_blocks=True,
        auto_reload=False,
    )
    env.filters["age"] = views.age
    env.filters["state_class"] = views.state_class
    env.filters["json"] = lambda v: json.dumps(v, indent=None, sort_keys=True, default=str)
    env.filters["pending"] = views.pending_parts
    env.filters["size"] = views.size_text
    env.filters["ts"] = lambda d: d.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S") if d else ""
    return env


class Web:
    """The dashboard's state: settings, the API client, the sampler, the templates."""

    def __init__(self, settings: WebSettings, client: Client) -> None:
        self.settings = settings
        self.client = client
        self.sampler = Sampler(client, refresh_s=settings.web_refresh_s, queue_max=settings.web_queue_max)
        self.templates = _templates()
        self.token = settings.web_token.get_secret_value() if settings.web_token is not None else None
        self.revocations: revocations.Revocations | None = None
        self.sessions: sessions.Sessions | None = None
        if self.token is not None:  # logouts shared by every replica (devsched.web.revocations)
            bucket = client.subjects.web_revoked_bucket
            timeout = settings.web_request_timeout_s
            self.revocations = revocations.Revocations(client.nc, bucket, publish_timeout_s=timeout)
            self.sessions = sessions.Sessions(self.token, self.revocations.ids)
        self.logins = limits.LoginLimiter(settings.web_login_failures_per_ip, settings.web_login_failures_total)
        self.streams = limits.StreamSlots(settings.web_streams_per_client, settings.web_streams_total)
        self._rendered: dict[Hashable, str] = {}
        self._rendered_version = 0
        self._reads: dict[Hashable, tuple[int, asyncio.Task[Any]]] = {}

    def cached(self, key: Hashable, version: int, render: Callable[[], str]) -> str:
        """`render()` once per snapshot version and `key`: every viewer and live stream of it shares the HTML.

        Only the newest version's fragments are kept; a caller still holding an older snapshot renders its own.
        """
        if version > self._rendered_version:
            self._rendered, self._rendered_version = {}, version
        elif version < self._rendered_version:
            return render()
        html = self._rendered.get(key)
        if html is None:
            html = self._rendered[key] = render()
        return html

    async def shared(self, key: Hashable, version: int, read: Callable[[], Awaitable[Any]]) -> Any:
        """`await read()` once per `key` and `version`, shared by every live stream that asks.

        All the streams of one task (or one device's history) wait for the same scheduler request.
        """
        held = self._reads.get(key)
        if held is None or held[0] != version:
            if len(self._reads) > 2 * self.settings.web_streams_total:
                self._reads = {k: v for k, v in self._reads.items() if not v[1].done()}
            reading = asyncio.ensure_future(read())
            reading.add_done_callback(_retrieved)  # a failure nobody waits for any more is not "never retrieved"
            held = self._reads[key] = (version, reading)
        # shielded: one stream that closes does not cancel the read the others wait for
        return await asyncio.shield(held[1])

    # -- who may act -----------------------------------------------------------------------------------------

    def logged_in(self, request: Request) -> bool:
        """Whether the request comes from someone allowed to act (token session, or the trusted proxy)."""
        if not self.settings.web_actions:
            return False
        if self.sessions is None:
            return self.settings.web_auth_proxy
        return self.sessions.check(request.cookies.get(security.SESSION_COOKIE), time.time())

    def secure(self, request: Request) -> bool:
        """Whether cookies get `Secure`: the request came over https (as a trusted proxy says), or forced."""
        return self.settings.web_secure_cookies or request.url.scheme == "https"

    def context(self, request: Request, csrf: str) -> dict[str, Any]:
        """What every page's layout needs."""
        return {
            "request_path": request.url.path,
            "csrf": csrf,
            "actions_enabled": self.settings.web_actions,
            "can_act": self.logged_in(request),
            "has_token": self.token is not None,
            "snapshot": self.sampler.snapshot,
            "now": datetime.now(UTC),
        }

    def live_context(self, request: Request) -> dict[str, Any]:
        """`context` for a live stream: the page's CSRF token, for the forms its fragments hold."""
        return self.context(request, security.csrf_cookie(request.cookies.get(security.CSRF_COOKIE)) or "")

    def page(self, request: Request, template: str, status_code: int = 200, **values: Any) -> HTMLResponse:
        """A rendered page, setting the CSRF cookie when the browser has none."""
        cookie = security.csrf_cookie(request.cookies.get(security.CSRF_COOKIE))
        csrf = cookie or security.new_csrf_token()
        html = self.templates.get_template(template).render({**self.context(request, csrf), **values})
        response = HTMLResponse(html, status_code=status_code)
        if cookie is None:
            secure = self.secure(request)
            response.set_cookie(security.CSRF_COOKIE, csrf, httponly=True, samesite="strict", secure=secure)
        return response

    def fragment(self, template: str, **values: Any) -> str:
        """A live region re-rendered (no CSRF cookie can be set on an event stream: forms reuse the page's)."""
        return self.templates.get_template(template).render(**values)

    def refuse_unless_sessions_checked(self) -> None:
        """503 while this replica may not know every logout (sessions fail closed: `devsched.web.revocations`)."""
        problem = self.revocations.problem() if self.revocations is not None else None
        if problem is not None:
            raise HTTPException(
                503, f"sessions cannot be checked here now ({problem}); try again", {"retry-after": "5"}
            )

    async def guard(self, request: Request) -> FormData:
        """The form of an action POST, or 403: actions off, bad origin, bad CSRF token, or not logged in."""
        if not self.settings.web_actions:
            raise HTTPException(403, "actions are disabled (DEVSCHED_WEB_ACTIONS)")
        if not security.same_origin(request.headers.get("origin"), request.headers.get("host")):
            raise HTTPException(403, "cross-origin request refused")
        form = await request.form()
        submitted = form.get(security.CSRF_FIELD)
        token = submitted if isinstance(submitted, str) else None
        if not security.csrf_ok(security.csrf_cookie(request.cookies.get(security.CSRF_COOKIE)), token):
            raise HTTPException(403, "missing or wrong CSRF token: reload the page and try again")
        return form


def _retrieved(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()


# -- requests ------------------------------------------------------------------------------------------------


def web_of(request: Request) -> Web:
    """The dashboard serving `request` (set by the app's lifespan)."""
    web: Web = request.app.state.web
    return web


def task_id_of(request: Request) -> uuid.UUID:
    """The `{task_id}` of the path, or 404."""
    try:
        return uuid.UUID(request.path_params["task_id"])
    except ValueError:
        raise HTTPException(404, "not a task id") from None


def client_address(request: Request) -> str:
    """The client's address (a trusted proxy's `X-Forwarded-For` client; uvicorn rewrote it)."""
    return request.client.host if request.client is not None else "unknown"
