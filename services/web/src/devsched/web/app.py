"""The dashboard's application: its routes, middleware and lifespan, and its health and readiness.

`/healthz` and `/readyz` are the services' probes (`devsched.service.health.Probes`), one definition served on
the dashboard's port and, with `metrics_port`, on the health listener the kubelet probes.

The pages and their live streams are in `devsched.web.pages`, the event streams' plumbing in
`devsched.web.live`, the actions in `devsched.web.actions`, login and logout in `devsched.web.login`,
artifact downloads in `devsched.web.downloads`, the plain-text log in `devsched.web.logtext`; what they
share (settings, client, sampler, templates, sessions, render caches) is `devsched.web.dashboard.Web`,
made by the lifespan here.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from devsched.client import Client
from devsched.service.health import NotReady, Probes, check_nats, serving_health
from devsched.web import actions, downloads, hosts, login, logtext, revocations, security
from devsched.web.dashboard import HERE, Web, web_of
from devsched.web.pages import charts, device, lab, queue, task
from devsched.web.settings import WebSettings


def add_checks(probes: Probes, app: Starlette) -> None:
    """Readiness: NATS answers, the first snapshot is loaded, and (with a token) every logout is known.

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

    async def sessions() -> None:  # every logout known here (with a token; sessions fail closed otherwise)
        revoked = web().revocations
        if revoked is not None and (problem := revoked.problem()) is not None:
            raise NotReady(problem)

    probes.check("nats", nats)
    probes.check("snapshot", snapshot)
    probes.check("sessions", sessions)


async def root(request: Request) -> Response:
    """To the lab."""
    return RedirectResponse("/lab", status_code=307)


async def _error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    web = web_of(request)
    if request.url.path.endswith(("/live", "/log", "/log.txt")):
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
        return await Client.from_settings(
            settings,
            prefix=settings.subject_prefix,
            timeout=settings.web_request_timeout_s,
            connect_timeout=30.0,
            name="devsched-web",
        )

    probes = Probes("devsched-web")

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        # The health listener first: alive (and not ready) while NATS is still being reached.
        async with serving_health(
            settings.metrics_host, settings.metrics_port, service=probes.service, probes=probes
        ) as health:
            app.state.health = health
            client = await (connect or default_connect)()
            web = Web(settings, client)
            app.state.web = web
            await web.sampler.subscribe()
            await web.sampler.sample()
            task = asyncio.create_task(web.sampler.run(), name="devsched-web sampler")
            following = await revocations.start(web.revocations)
            try:
                yield
            finally:
                await revocations.stop(following)
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
                await web.sampler.unsubscribe()
                await client.close()

    routes = [
        Route("/", root),
        Route("/lab", lab.lab_page),
        Route("/lab/live", lab.lab_live),
        Route("/queue", queue.queue_page),
        Route("/queue/live", queue.queue_live),
        Route("/charts", charts.charts_page),
        Route("/charts/live", charts.charts_live),
        Route("/tasks/{task_id}", task.task_page),
        Route("/tasks/{task_id}/live", task.task_live),
        Route("/tasks/{task_id}/log", task.task_log),
        Route("/tasks/{task_id}/log.txt", logtext.task_log_text),
        Route("/tasks/{task_id}/cancel", actions.cancel, methods=["POST"]),
        Route("/tasks/{task_id}/resubmit", actions.resubmit, methods=["POST"]),
        Route("/tasks/{task_id}/artifacts/{attempt:int}/{name:path}", downloads.artifact_download),
        Route("/devices/{device_id}", device.device_page),
        Route("/devices/{device_id}/live", device.device_live),
        Route("/devices/{device_id}/drain", actions.drain, methods=["POST"]),
        Route("/login", login.login_page),
        Route("/login", login.login, methods=["POST"]),
        Route("/logout", login.logout, methods=["POST"]),
        *probes.routes(),
        Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
    ]
    app = Starlette(
        routes=routes,
        lifespan=lifespan,
        middleware=[
            Middleware(hosts.HostAllowlist, entries=allowed_hosts(settings, port)),
            Middleware(security.SecurityHeaders),
        ],
        exception_handlers={HTTPException: _error},
    )
    add_checks(probes, app)
    app.state.probes = probes
    return app
