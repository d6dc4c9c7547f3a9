"""The services' HTTP port: `/healthz` (liveness), `/readyz` (readiness), and `/metrics` (`service.metrics`).

A small Starlette app served by uvicorn in the service's own event loop (`HealthServer`): uvicorn parses
HTTP, Starlette routes, and this module only says what each probe answers. The listener bounds what a client
controls: the request head's size (`MAX_REQUEST_BYTES`, h11's limit, else 400), how long the head may take
(`READ_TIMEOUT_S`, else 408) and taking the answer (`WRITE_TIMEOUT_S`, else the connection is cut), and how
many connections are open at once (`MAX_CONNECTIONS`, else 503 at once). Every answer closes its connection
(`Connection: close`, one request per connection, as the kubelet probes) and is never cached.

- `/healthz`: 200 whenever the event loop runs this handler, which is all liveness asks (a process whose
  loop is stuck never answers, and the kubelet restarts it). The body carries the uptime.
- `/readyz`: 200 when every check the service registered passes, else 503 with a JSON body naming each
  failing check and why. Checks run concurrently, each bounded by `check_timeout_s`, and their verdict is
  reused for `cache_s` (probes in a storm share one evaluation): a probe never hammers the database.

The two probes are one definition (`Probes`), served by the listener and, in the dashboard, by its own app.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from typing import Any

import h11
import uvicorn
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route
from starlette.types import ASGIApp
from uvicorn.protocols.http.h11_impl import H11Protocol

from devsched.service.readiness import Check, NotReady, Readiness, check_nats, plainly

# The readiness names are imported from here too (`devsched.service.readiness` defines them).
__all__ = [
    "MAX_REQUEST_BYTES",
    "Check",
    "HealthServer",
    "NotReady",
    "Probes",
    "Readiness",
    "check_nats",
    "plainly",
    "serving_health",
]

log = logging.getLogger("devsched.service.health")

#: Largest request head (request line and headers) read; a probe's is about 200 bytes.
MAX_REQUEST_BYTES = 8192
#: How long a client may take to send its request head.
READ_TIMEOUT_S = 5.0
#: After that, how long it may take to read the answer (a client that stops reading is cut off).
WRITE_TIMEOUT_S = 5.0
#: Connections served at once; more are answered 503 and closed.
MAX_CONNECTIONS = 64
#: How long `HealthServer.close` lets answers in progress finish.
CLOSE_TIMEOUT_S = 2

#: A route's handler: a Starlette endpoint or an ASGI app (`/metrics`); it runs on the event loop, so it must
#: not block.
Endpoint = Callable[[Request], Awaitable[Response]] | ASGIApp


def json_body(data: Mapping[str, Any]) -> bytes:
    """The bytes of every JSON answer here: compact, one line."""
    return json.dumps(data, separators=(",", ":")).encode() + b"\n"


def json_response(status: int, data: Mapping[str, Any], headers: Mapping[str, str] | None = None) -> Response:
    """A JSON answer (`json_body`)."""
    return Response(json_body(data), status, headers, media_type="application/json")


class Probes:
    """`/healthz` and `/readyz` of one service: its name, its readiness checks and when it started."""

    def __init__(self, service: str, readiness: Readiness | None = None) -> None:
        self.service = service
        self.readiness = readiness or Readiness()
        self.started = time.monotonic()

    def check(self, name: str, check: Check) -> None:
        """Register a readiness check (`Readiness.add`)."""
        self.readiness.add(name, check)

    async def healthz(self, request: Request) -> Response:
        """Alive: 200 with the service's name and uptime."""
        uptime = round(time.monotonic() - self.started, 3)
        return json_response(200, {"status": "ok", "service": self.service, "uptime_s": uptime})

    async def readyz(self, request: Request) -> Response:
        """Ready: 200 when every check passes, else 503; the body names each check and why it failed."""
        verdict = await self.readiness.verdict()
        return json_response(200 if verdict.ready else 503, {"service": self.service, **verdict.to_json()})

    def routes(self) -> list[BaseRoute]:
        """The two probes as routes (GET, and HEAD as Starlette answers it)."""
        return [Route("/healthz", self.healthz, methods=["GET"]), Route("/readyz", self.readyz, methods=["GET"])]


class HealthServer:
    """The HTTP listener of one service: its `Probes`, and whatever else is registered (`/metrics`)."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        service: str,
        probes: Probes | None = None,
        max_connections: int = MAX_CONNECTIONS,
        read_timeout_s: float = READ_TIMEOUT_S,
        write_timeout_s: float = WRITE_TIMEOUT_S,
    ) -> None:
        """`probes`: the ones to serve (the dashboard shares its own); new ones for `service` by default."""
        self.host = host
        self.requested_port = port
        self.probes = probes or Probes(service)
        self.max_connections = max_connections
        self.read_timeout_s = read_timeout_s
        self.write_timeout_s = write_timeout_s
        self._app = Starlette(
            routes=self.probes.routes(), exception_handlers={HTTPException: self._refused, Exception: _failed}
        )
        self._server: _Server | None = None
        self._serving: asyncio.Task[None] | None = None
        self._port: int | None = None

    @property
    def readiness(self) -> Readiness:
        """The service's readiness checks."""
        return self.probes.readiness

    def check(self, name: str, check: Check) -> None:
        """Register a readiness check (`Readiness.add`)."""
        self.probes.check(name, check)

    def route(self, path: str, endpoint: Endpoint) -> None:
        """Serve GET (and HEAD) `path` with `endpoint`, a Starlette endpoint or an ASGI app (`/metrics`).

        Registering once listening works too: the routes are read per request.
        """
        if not path.startswith("/"):
            raise ValueError(f"a route is an absolute path, not {path!r}")
        self._app.router.routes.append(Route(path, endpoint, methods=["GET"]))

    @property
    def paths(self) -> list[str]:
        """The paths served."""
        return sorted(route.path for route in self._app.router.routes if isinstance(route, Route))

    @property
    def port(self) -> int:
        """The port listened on (the one chosen by the system when 0 was asked for)."""
        return self.requested_port if self._port is None else self._port

    @property
    def connections(self) -> int:
        """Connections open now."""
        return 0 if self._server is None else len(self._server.server_state.connections)

    async def start(self) -> None:
        """Listen; raises `OSError` when the address is unusable (taken, not local)."""
        sock = await _listen(self.host, self.requested_port)
        config = uvicorn.Config(
            self._app,
            http=_deadlines(self.read_timeout_s, self.write_timeout_s),
            ws="none",
            lifespan="off",
            interface="asgi3",
            log_config=None,
            access_log=False,
            proxy_headers=False,
            server_header=False,
            headers=[("Cache-Control", "no-store"), ("Connection", "close")],
            limit_concurrency=self.max_connections + 1,  # uvicorn refuses at the limit, we above it
            h11_max_incomplete_event_size=MAX_REQUEST_BYTES,
            timeout_graceful_shutdown=CLOSE_TIMEOUT_S,
        )
        server = _Server(config)
        serving = asyncio.create_task(server.serve(sockets=[sock]), name=f"{self.probes.service} health listener")
        listening = asyncio.create_task(server.listening.wait())
        await asyncio.wait({serving, listening}, return_when=asyncio.FIRST_COMPLETED)
        if not listening.done():
            listening.cancel()
            sock.close()
            serving.result()  # its error, if it raised one
            raise RuntimeError("the health listener stopped before it listened")
        self._server, self._serving, self._port = server, serving, int(sock.getsockname()[1])
        log.info("health endpoints listening", extra={"host": self.host, "port": self.port})

    async def close(self) -> None:
        """Stop listening and end the connections still open (within `CLOSE_TIMEOUT_S`, and a little more)."""
        server, serving = self._server, self._serving
        if server is None or serving is None:
            return
        self._server = self._serving = None
        server.should_exit = True
        _, late = await asyncio.wait({serving}, timeout=CLOSE_TIMEOUT_S + 1.0)
        if late:
            serving.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await serving

    async def _refused(self, request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        data: dict[str, Any] = {"error": str(exc.detail).lower()}
        if exc.status_code == 404:
            data["paths"] = self.paths
        return json_response(exc.status_code, data, exc.headers)


async def _failed(request: Request, exc: Exception) -> Response:
    # uvicorn logs the error and its traceback
    return json_response(500, {"error": "internal error"})


async def _listen(host: str, port: int) -> socket.socket:
    """A listening socket on `host`:`port` (its first address), made here so that an unusable one raises."""
    loop = asyncio.get_running_loop()
    family, kind, proto, _, address = (
        await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    )[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(MAX_CONNECTIONS)
    except OSError:
        sock.close()
        raise
    return sock


class _Server(uvicorn.Server):
    """uvicorn's server inside the service's loop: the service owns its signals; says when it listens."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.listening = asyncio.Event()

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield  # SIGTERM is the service's (`devsched.service.lifecycle`), never the listener's

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        self.listening.set()


class _Deadlines(H11Protocol):
    """uvicorn's h11 protocol with the deadlines uvicorn lacks (its issue 157, "timeout-request-start").

    A client has `read_timeout_s` to send its request head, else it is answered 408; one that has not taken
    its answer `write_timeout_s` later (every answer closes the connection) is cut off.
    """

    read_timeout_s = READ_TIMEOUT_S
    write_timeout_s = WRITE_TIMEOUT_S
    _timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)  # type: ignore[arg-type]  # uvicorn narrows it to Transport
        self._timer = self.loop.call_later(self.read_timeout_s, self._expire)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
        super().connection_lost(exc)

    def _expire(self) -> None:
        if self.transport.is_closing() or self.conn.our_state is not h11.IDLE:
            self._timer = self.loop.call_later(self.write_timeout_s, self.transport.abort)
            return
        body = json_body({"error": "request not received in time"})
        headers = [("Content-Type", "application/json"), ("Content-Length", str(len(body))), ("Connection", "close")]
        with contextlib.suppress(h11.LocalProtocolError):  # h11 lets a server answer before any request
            for event in (h11.Response(status_code=408, headers=headers), h11.Data(data=body), h11.EndOfMessage()):
                self.transport.write(self.conn.send(event) or b"")
        self.transport.close()


def _deadlines(read_timeout_s: float, write_timeout_s: float) -> type[_Deadlines]:
    return type("Deadlines", (_Deadlines,), {"read_timeout_s": read_timeout_s, "write_timeout_s": write_timeout_s})


@contextlib.asynccontextmanager
async def serving_health(
    host: str, port: int | None, *, service: str, probes: Probes | None = None
) -> AsyncIterator[HealthServer | None]:
    """A started `HealthServer` for the block (closed after it), or None when `port` is None (off)."""
    if port is None:
        yield None
        return
    server = HealthServer(host, port, service=service, probes=probes)
    await server.start()
    try:
        yield server
    finally:
        await server.close()
