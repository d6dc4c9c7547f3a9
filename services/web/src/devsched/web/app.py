"""The Starlette application: pages, live fragments (server-sent events) and the three actions.

Pages render from the sampler's snapshot (lab, queue, charts, device) or from one `tasks.get` plus the
task's stored events (task). Each page has a live region that `static/app.js` keeps current from an
event stream of re-rendered fragments: the HTML is always made here, by autoescaped templates.
Actions (cancel, drain, undrain) are POST forms: off unless `web_actions`, then guarded by the CSRF
token, the `Origin` check and the operator's session (`security`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Hashable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import nats.errors
from jinja2 import Environment, FileSystemLoader, select_autoescape
from markupsafe import Markup
from starlette.applications import Starlette
from starlette.datastructures import FormData
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import (
    HTMLResponse,
    JSONResponse,
    PlainTextResponse,
    RedirectResponse,
    Response,
    StreamingResponse,
)
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from devsched.client import Client, DevschedError, InvalidRequest, NotFound
from devsched.core.status import TERMINAL
from devsched.protocol.messages import LogKind
from devsched.service.health import HealthServer, NotReady, check_nats, serving_health
from devsched.web import charts, downloads, hosts, limits, security, sessions, views
from devsched.web.events import stored_events
from devsched.web.sampler import Sampler, Snapshot
from devsched.web.settings import WebSettings

log = logging.getLogger("devsched.web")

HERE = Path(__file__).parent
#: Seconds between keep-alive comments on a quiet event stream.
KEEPALIVE_S = 15.0
#: Queued tasks a queue page lists (`?page=N` for the next ones): a page's cost does not grow with the queue.
QUEUE_ROWS = 200
#: Running tasks the queue page lists (the count says how many more).
RUNNING_ROWS = 200
#: Minutes the charts show.
CHART_MINUTES = 60


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
        self._token = settings.web_token.get_secret_value() if settings.web_token is not None else None
        self.sessions = sessions.Sessions(self._token) if self._token is not None else None
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
            "has_token": self._token is not None,
            "snapshot": self.sampler.snapshot,
            "now": datetime.now(UTC),
        }

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


# -- pages -------------------------------------------------------------------------------------------------


def _web(request: Request) -> Web:
    web: Web = request.app.state.web
    return web


def _lab_values(web: Web, snap: Snapshot, filters: Mapping[str, str]) -> dict[str, Any]:
    now = datetime.now(UTC)
    return {"lab": views.lab(snap.hosts, snap.on_device, filters, now), "snapshot": snap, "now": now}


async def lab_page(request: Request) -> Response:
    """The lab: every host and device, coloured by state, filtered by `?label=key=value`."""
    web = _web(request)
    filters = views.parse_label_filters(request.query_params.getlist("label"))
    values = _lab_values(web, web.sampler.snapshot, filters)
    live = "/lab/live" + ("?" + urlencode([("label", f"{k}={v}") for k, v in filters.items()]) if filters else "")
    return web.page(request, "lab.html", live=live, **values)


async def lab_live(request: Request) -> Response:
    """The lab's grid as it changes."""
    web = _web(request)
    filters = views.parse_label_filters(request.query_params.getlist("label"))
    return _stream(web, request, lambda snap: web.fragment("_lab.html", **_lab_values(web, snap, filters)))


def _queue_fragment(web: Web, snap: Snapshot, page: int) -> str:
    """The queue's tables for one page of the queued tasks, rendered once per snapshot version and page.

    Ages are as of the snapshot (`snap.at`, at most a refresh old), so that one rendering serves everyone.
    """

    def render() -> str:
        now = snap.at
        progress = {task_id: r.progress for task_id, r in snap.progress.items()}
        queued = views.window(len(snap.queued), page, QUEUE_ROWS)
        return web.fragment(
            "_queue.html",
            queued=[views.task_row(t, now) for t in snap.queued[queued.start : queued.stop]],
            queued_window=queued,
            queued_capped=snap.queued_capped,
            running=[views.task_row(t, now, progress.get(str(t.task_id))) for t in snap.running[:RUNNING_ROWS]],
            running_total=len(snap.running),
            recent=[views.task_row(t, now) for t in snap.recent],
        )

    return web.cached(("queue", views.window(len(snap.queued), page, QUEUE_ROWS).page), snap.version, render)


async def queue_page(request: Request) -> Response:
    """Queued tasks (next first, a page of them: `?page=N`), running ones with their step, the newest ones."""
    web = _web(request)
    page = views.page_number(request.query_params.get("page"))
    live = "/queue/live" + (f"?page={page}" if page > 1 else "")
    fragment = Markup(_queue_fragment(web, web.sampler.snapshot, page))
    return web.page(request, "queue.html", live=live, fragment=fragment)


async def queue_live(request: Request) -> Response:
    """The queue's tables as they change (the page given by `?page=N`)."""
    web = _web(request)
    page = views.page_number(request.query_params.get("page"))
    return _stream(web, request, lambda snap: _queue_fragment(web, snap, page))


def _charts_values(web: Web, snap: Snapshot) -> dict[str, Any]:
    now = datetime.now(UTC)
    finished = web.sampler.series.finished_per_minute(now, CHART_MINUTES)
    depth = web.sampler.series.depth_per_minute(now, CHART_MINUTES)
    finished_bars, finished_top = charts.stacked_bars(finished, 600, 160)
    depth_bars, depth_top = charts.depth_bars(depth, 600, 160)
    totals = {o: sum(c.get(o, 0) for _, c in finished) for o in charts.OUTCOMES}
    return {
        "finished_bars": finished_bars,
        "finished_top": finished_top,
        "depth_bars": depth_bars,
        "depth_top": depth_top,
        "totals": totals,
        "minutes": CHART_MINUTES,
        "snapshot": snap,
        "now": now,
    }


async def charts_page(request: Request) -> Response:
    """Tasks finished per minute by outcome, and the queue depth."""
    web = _web(request)
    return web.page(request, "charts.html", live="/charts/live", **_charts_values(web, web.sampler.snapshot))


async def charts_live(request: Request) -> Response:
    """The charts as they change."""
    web = _web(request)
    return _stream(web, request, lambda snap: web.fragment("_charts.html", **_charts_values(web, snap)))


def _task_id(request: Request) -> uuid.UUID:
    try:
        return uuid.UUID(request.path_params["task_id"])
    except ValueError:
        raise HTTPException(404, "not a task id") from None


async def _task_values(web: Web, task_id: uuid.UUID) -> dict[str, Any]:
    try:
        view, events = await asyncio.gather(web.client.get(task_id), stored_events(web.client, task_id))
    except NotFound:
        raise HTTPException(404, f"no task {task_id}") from None
    if "artifacts" in view.truncated:  # cut to fit one reply: the listing pages them
        view = view.model_copy(update={"artifacts": (await web.client.artifacts(task_id)).artifacts})
    return {
        "task": view,
        "status": str(view.status),
        "attempts": [views.attempt_row(a, events) for a in reversed(view.attempts)],
        "events": events,
        "steps": views.step_rows(view),
        "results": views.result_summaries(view),
        "artifacts": views.artifacts(view),
        "policy": views.policy_rows(view),
        "metadata": views.redact(view.metadata),
        "cancellable": views.cancellable(str(view.status)),
        "now": datetime.now(UTC),
    }


async def task_page(request: Request) -> Response:
    """One task: status, attempts as a timeline, test results, events, the live log, the plan."""
    web = _web(request)
    task_id = _task_id(request)
    values = await _task_values(web, task_id)
    return web.page(request, "task.html", live=f"/tasks/{task_id}/live", **values)


async def task_live(request: Request) -> Response:
    """The task's live part as it changes, until the task ends."""
    web = _web(request)
    task_id = _task_id(request)
    csrf = security.csrf_cookie(request.cookies.get(security.CSRF_COOKIE)) or ""
    base = web.context(request, csrf)
    held: list[dict[str, Any]] = []

    async def render(snap: Snapshot) -> str:
        # one read of the task per snapshot, whatever the number of its pages open
        values: dict[str, Any] = await web.shared(("task", task_id), snap.version, lambda: _task_values(web, task_id))
        held[:] = [values]
        return web.fragment("_task.html", **{**base, **values})

    async def over() -> bool:
        return bool(held) and held[0]["task"].status in TERMINAL

    return _stream(web, request, render, ended=over)


async def task_log(request: Request) -> Response:
    """The task's step output as events: `output` (JSON text), `step` (a step ended), `end`."""
    web = _web(request)
    task_id = _task_id(request)
    release = _admit(web, request)
    try:
        view = await web.client.get(task_id)
    except NotFound:
        release()
        raise HTTPException(404, f"no task {task_id}") from None
    except BaseException:
        release()
        raise
    leases = {str(a.lease_id) for a in view.attempts}

    async def lines() -> AsyncGenerator[str, None]:
        yield "retry: 3000\n\n"
        try:
            async with web.client.logs(task_id, follow=True) as records:
                attempt = None
                async for record in records:
                    if record.attempt != attempt:
                        attempt = record.attempt
                        leases.update(str(a.lease_id) for a in (await web.client.get(task_id)).attempts)
                        yield _sse("output", json.dumps(f"── attempt {attempt} ──\n"))
                    if record.kind == LogKind.OUTPUT:
                        text = record.content().decode("utf-8", "replace")
                        yield _sse("output", json.dumps(views.hide_lease_ids(text, leases)))
                    elif record.kind == LogKind.STEP_END:
                        yield _sse("output", json.dumps(f"── step {record.step} {record.status} ──\n"))
                    elif record.kind in (LogKind.DROPPED, LogKind.TRUNCATED):
                        yield _sse("output", json.dumps(f"── {record.kind} ──\n"))
        except DevschedError as exc:
            yield _sse("output", json.dumps(f"── log unavailable: {exc} ──\n"))
        yield _sse("end", "{}")

    expired = _sse("output", json.dumps("── live log closed after a while: reload the page to follow ──\n"))
    return _LiveResponse(_bounded(lines(), web.settings.web_stream_max_s, expired + _sse("end", "{}")), release)


async def artifact_download(request: Request) -> Response:
    """One stored artifact as an attachment, streamed from the artifacts bucket through this process."""
    web = _web(request)
    task_id = _task_id(request)
    attempt = int(request.path_params["attempt"])
    name = request.path_params["name"]
    try:
        bucket, artifact = await downloads.find(web.client, task_id, attempt, name)
        chunks = await downloads.open_chunks(web.client, bucket, artifact)
    except NotFound as exc:
        raise HTTPException(404, str(exc)) from None
    except (DevschedError, nats.errors.Error) as exc:
        log.warning("artifact download failed: %s", exc, extra={"task_id": str(task_id)})
        raise HTTPException(502, "the artifact cannot be read now") from None
    filename = name.rsplit("/", 1)[-1]
    ascii_name = "".join(c if c.isascii() and c.isprintable() and c not in '"\\;' else "_" for c in filename)
    headers = {
        "content-disposition": f"attachment; filename=\"{ascii_name}\"; filename*=UTF-8''{quote(filename, safe='')}",
        "content-length": str(artifact.size),
        "x-devsched-sha256": artifact.sha256,
    }
    log.info("artifact downloaded", extra={"task_id": str(task_id), "attempt": attempt, "size": artifact.size})
    return StreamingResponse(chunks, media_type="application/octet-stream", headers=headers)


@dataclass(slots=True)
class _History:
    """A device's history page as last read, and the device's change count when it was read."""

    rows: list[views.HistoryRow]
    more: str | None
    changes: int


async def _read_history(web: Web, device_id: str, after: str | None) -> _History:
    """One page of the device's tasks and health checks from `P.api.tasks.list` (issue 15)."""
    changes = web.sampler.device_changes.get(device_id, 0)
    page = await web.sampler.client.list_page(device_id=device_id, limit=views.HISTORY_PAGE, after=after)
    return _History(views.device_history(page.tasks), views.more_path(device_id, page.next), changes)


def _device_values(web: Web, snap: Snapshot, device_id: str, history: _History) -> dict[str, Any]:
    for host in snap.hosts:
        for device in host.devices:
            if device.device_id == device_id:
                state = views.device_state(device, host.online)
                return {
                    "device": device,
                    "host": host,
                    "state": state,
                    "running": snap.on_device.get(device_id),
                    "history": history.rows,
                    "more": history.more,
                    "snapshot": snap,
                    "now": datetime.now(UTC),
                }
    raise HTTPException(404, f"no device {device_id}")


def _history_query(request: Request) -> str | None:
    after = request.query_params.get("after")
    return after or None


async def device_page(request: Request) -> Response:
    """One device: state, what runs on it, its history of tasks and health checks, drain and undrain."""
    web = _web(request)
    device_id = request.path_params["device_id"]
    after = _history_query(request)
    try:
        history = await _read_history(web, device_id, after)
    except InvalidRequest as exc:
        raise HTTPException(400, str(exc)) from None
    values = _device_values(web, web.sampler.snapshot, device_id, history)
    live = f"/devices/{device_id}/live" + (f"?after={quote(after, safe='')}" if after else "")
    return web.page(request, "device.html", live=live, **values)


async def device_live(request: Request) -> Response:
    """The device's live part as it changes; its history is re-read when the device's tasks changed."""
    web = _web(request)
    device_id = request.path_params["device_id"]
    after = _history_query(request)
    base = web.context(request, security.csrf_cookie(request.cookies.get(security.CSRF_COOKIE)) or "")
    held: list[_History] = []

    async def render(snap: Snapshot) -> str:
        changes = web.sampler.device_changes.get(device_id, 0)
        if not held or held[0].changes != changes:
            # one read per change of the device, whatever the number of its pages open
            history = web.shared(("history", device_id, after), changes, lambda: _read_history(web, device_id, after))
            held[:] = [await history]
        return web.fragment("_device.html", **{**base, **_device_values(web, snap, device_id, held[0])})

    return _stream(web, request, render)


# -- actions -----------------------------------------------------------------------------------------------


def _refuse_unless_logged_in(web: Web, request: Request) -> None:
    if not web.logged_in(request):
        raise HTTPException(403, "log in with the operator token first")


async def cancel(request: Request) -> Response:
    """Cancel a task (action)."""
    web = _web(request)
    await web.guard(request)
    _refuse_unless_logged_in(web, request)
    task_id = _task_id(request)
    try:
        await web.client.cancel(task_id, reason="cancelled from devsched-web")
    except NotFound:
        raise HTTPException(404, f"no task {task_id}") from None
    log.info("task cancelled from the dashboard", extra={"task_id": str(task_id)})
    web.sampler.poke()
    return RedirectResponse(f"/tasks/{task_id}", status_code=303)


async def drain(request: Request) -> Response:
    """Drain (`drained=true`) or undrain (`drained=false`) a device (action)."""
    web = _web(request)
    form = await web.guard(request)
    _refuse_unless_logged_in(web, request)
    device_id = request.path_params["device_id"]
    drained = form.get("drained") != "false"
    reason = form.get("reason")
    try:
        await web.client.drain(
            device_id, drained=drained, reason=(reason if isinstance(reason, str) and reason else None)
        )
    except NotFound:
        raise HTTPException(404, f"no device {device_id}") from None
    except DevschedError as exc:
        raise HTTPException(400, str(exc)) from None
    log.info("device %s from the dashboard", "drained" if drained else "undrained", extra={"device_id": device_id})
    await web.sampler.sample()
    return RedirectResponse(f"/devices/{device_id}", status_code=303)


async def login_page(request: Request) -> Response:
    """The login form (only with actions on and a token configured)."""
    web = _web(request)
    if not web.settings.web_actions or web._token is None:
        raise HTTPException(404, "no login: actions are disabled or handled by a proxy")
    return web.page(request, "login.html", next=_local(request.query_params.get("next")), failed=False)


async def login(request: Request) -> Response:
    """Check the operator token; on success set the signed session cookie."""
    web = _web(request)
    form = await web.guard(request)
    if web._token is None or web.sessions is None:
        raise HTTPException(404, "no login: actions are handled by a proxy")
    given = form.get("token")
    target = _local(form.get("next"))
    client = _client(request)
    wait = web.logins.retry_after(client, time.monotonic())
    if wait is not None:  # the right token too: a guesser learns nothing more while limited
        refused = web.page(request, "login.html", status_code=429, next=target, failed=True, limited=wait)
        refused.headers["retry-after"] = str(wait)
        return refused
    if not isinstance(given, str) or not security.token_ok(web._token, given):
        web.logins.failed(client, time.monotonic())
        log.warning("dashboard login refused")
        return web.page(request, "login.html", status_code=403, next=target, failed=True)
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
    """End the session: revoked here (a copy of the cookie replayed later is no session), and forgotten."""
    web = _web(request)
    await web.guard(request)
    if web.sessions is not None and web.sessions.revoke(request.cookies.get(security.SESSION_COOKIE), time.time()):
        log.info("dashboard logout", extra={"revoked": web.sessions.revoked})
    response = RedirectResponse("/", status_code=303)
    response.delete_cookie(security.SESSION_COOKIE, httponly=True, samesite="strict", secure=web.secure(request))
    return response


def _local(target: object) -> str:
    """A redirect target on this site only (`/path`), else `/`."""
    if isinstance(target, str) and target.startswith("/") and not target.startswith("//") and "\\" not in target:
        return target
    return "/"


# -- plumbing ----------------------------------------------------------------------------------------------


def _sse(event: str, data: str) -> str:
    return f"event: {event}\n" + "".join(f"data: {line}\n" for line in data.split("\n")) + "\n"


def _client(request: Request) -> str:
    """The client's address (a trusted proxy's `X-Forwarded-For` client; uvicorn rewrote it)."""
    return request.client.host if request.client is not None else "unknown"


def _admit(web: Web, request: Request) -> Callable[[], None]:
    """A slot for one more live stream of this client, or 429; the function that gives it back (once)."""
    client = _client(request)
    if not web.streams.take(client):
        raise HTTPException(429, "too many live streams open: close some pages", headers={"retry-after": "10"})
    given = False

    def release() -> None:
        nonlocal given
        if not given:
            given = True
            web.streams.give(client)

    return release


class _LiveResponse(StreamingResponse):
    """An event stream holding a stream slot until it ends, however it ends."""

    def __init__(self, content: AsyncGenerator[str, None], release: Callable[[], None]) -> None:
        super().__init__(content, media_type="text/event-stream", headers={"x-accel-buffering": "no"})
        self._release = release

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._release()


async def _bounded(events: AsyncGenerator[str, None], lifetime_s: float, last: str = "") -> AsyncGenerator[str, None]:
    """`events` for at most `lifetime_s` seconds, then `last` and the end (a browser opens a new stream)."""
    deadline = time.monotonic() + lifetime_s
    try:
        while (left := deadline - time.monotonic()) > 0:
            try:
                yield await asyncio.wait_for(anext(events), left)
            except StopAsyncIteration:
                return
            except TimeoutError:
                break
        if last:
            yield last
    finally:
        await events.aclose()


def _stream(
    web: Web,
    request: Request,
    render: Callable[[Snapshot], str | Awaitable[str]],
    *,
    ended: Callable[[], Awaitable[bool]] | None = None,
) -> StreamingResponse:
    """An event stream of `fragment` events: the region re-rendered at each new snapshot when it changed.

    With `ended`, the stream sends `end` (the page stops listening) once it says the subject is over.
    Admitted only within the client's and the process's stream slots (else 429), for `web_stream_max_s`.
    """
    release = _admit(web, request)

    async def events() -> AsyncGenerator[str, None]:
        yield "retry: 2000\n\n"
        version = -1
        last = None
        while True:
            snap = await web.sampler.changed(version, KEEPALIVE_S)
            if snap.version == version:
                yield ": keep-alive\n\n"
                continue
            version = snap.version
            try:
                html = render(snap)
                if not isinstance(html, str):
                    html = await html
            except HTTPException as exc:
                yield _sse("gone", json.dumps(str(exc.detail)))
                return
            except DevschedError as exc:
                log.warning("live render failed: %s", exc)
                continue
            if html != last:
                last = html
                yield _sse("fragment", html)
            if ended is not None and await ended():
                yield _sse("end", "{}")
                return

    return _LiveResponse(_bounded(events(), web.settings.web_stream_max_s), release)


async def healthz(request: Request) -> Response:
    """Alive."""
    return PlainTextResponse("ok")


def add_checks(health: HealthServer, app: Starlette) -> None:
    """Readiness on the health listener (`metrics_port`): NATS answers, and the first snapshot is loaded.

    A later sample that fails keeps the last snapshot on screen (with its error shown), so it is not a
    condition: pages still render, and the sampler tries again.
    """

    def web() -> Web:
        found: Web | None = getattr(app.state, "web", None)
        if found is None:
            raise NotReady("not connected yet")
        return found

    async def nats() -> None:
        await check_nats(web().client.nc)

    async def snapshot() -> None:
        if not web().sampler.snapshot.ready:
            raise NotReady("no snapshot of the lab loaded yet")

    health.check("nats", nats)
    health.check("snapshot", snapshot)


async def readyz(request: Request) -> Response:
    """Ready once a sample succeeded and NATS is connected.

    For a port-forward; the kubelet probes the health listener's `/readyz` (`add_checks`).
    """
    web = _web(request)
    snap = web.sampler.snapshot
    ready = snap.ready and snap.error is None and web.client.nc.is_connected
    return JSONResponse({"ready": ready, "error": snap.error}, status_code=200 if ready else 503)


async def root(request: Request) -> Response:
    """To the lab."""
    return RedirectResponse("/lab", status_code=307)


async def _error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    web = _web(request)
    if request.url.path.endswith(("/live", "/log")):
        return PlainTextResponse(str(exc.detail), status_code=exc.status_code, headers=exc.headers)
    response = web.page(request, "error.html", status_code=exc.status_code, code=exc.status_code, message=exc.detail)
    response.headers.update(exc.headers or {})
    return response


def allowed_hosts(settings: WebSettings, port: int | None = None) -> list[hosts.Allowed]:
    """The `Host` headers served: `web_allowed_hosts`, else the default for the bind address and port."""
    if settings.web_allowed_hosts is not None:
        return hosts.parse(settings.web_allowed_hosts)
    return hosts.default(settings.web_host, settings.web_port if port is None else port, loopback=settings.loopback)


def create_app(
    settings: WebSettings, *, connect: Callable[[], Awaitable[Client]] | None = None, port: int | None = None
) -> Starlette:
    """The application; its lifespan connects to NATS, takes a first sample and runs the sampler.

    `port`: the one listened on (with `web_port` 0, known once bound), for the default `Host` allowlist.
    """

    async def default_connect() -> Client:
        access = settings.nats_access()
        return await Client.connect(
            settings.nats_url,
            prefix=settings.subject_prefix,
            creds=access.creds,
            nkey_seed=access.nkey_seed,
            user=access.user,
            password_file=access.password_file,
            tls_ca=access.tls_ca,
            tls_cert=access.tls_cert,
            tls_key=access.tls_key,
            tls_hostname=access.tls_hostname,
            timeout=settings.web_request_timeout_s,
            connect_timeout=30.0,
            name="devsched-web",
        )

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        # The health listener first: alive (and not ready) while NATS is still being reached.
        async with serving_health(settings.metrics_host, settings.metrics_port, service="devsched-web") as health:
            if health is not None:
                add_checks(health, app)
            app.state.health = health
            client = await (connect or default_connect)()
            web = Web(settings, client)
            app.state.web = web
            await web.sampler.subscribe()
            await web.sampler.sample()
            task = asyncio.create_task(web.sampler.run(), name="devsched-web sampler")
            try:
                yield
            finally:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
                await web.sampler.unsubscribe()
                await client.close()

    routes = [
        Route("/", root),
        Route("/lab", lab_page),
        Route("/lab/live", lab_live),
        Route("/queue", queue_page),
        Route("/queue/live", queue_live),
        Route("/charts", charts_page),
        Route("/charts/live", charts_live),
        Route("/tasks/{task_id}", task_page),
        Route("/tasks/{task_id}/live", task_live),
        Route("/tasks/{task_id}/log", task_log),
        Route("/tasks/{task_id}/cancel", cancel, methods=["POST"]),
        Route("/tasks/{task_id}/artifacts/{attempt:int}/{name:path}", artifact_download),
        Route("/devices/{device_id}", device_page),
        Route("/devices/{device_id}/live", device_live),
        Route("/devices/{device_id}/drain", drain, methods=["POST"]),
        Route("/login", login_page),
        Route("/login", login, methods=["POST"]),
        Route("/logout", logout, methods=["POST"]),
        Route("/healthz", healthz),
        Route("/readyz", readyz),
        Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
    ]
    return Starlette(
        routes=routes,
        lifespan=lifespan,
        middleware=[
            Middleware(hosts.HostAllowlist, entries=allowed_hosts(settings, port)),
            Middleware(security.SecurityHeaders),
        ],
        exception_handlers={HTTPException: _error},
    )
