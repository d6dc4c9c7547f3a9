"""The services' HTTP port: `/healthz` (liveness), `/readyz` (readiness), and room for `/metrics`.

A tiny HTTP/1.1 server on asyncio's `start_server`, because probes need nothing more and a web framework
would be one more dependency in every service. It answers GET only, one request per connection
(`Connection: close`), and bounds everything a client controls: the request head's size
(`MAX_REQUEST_BYTES`, else 431), how long it may take to send it (`READ_TIMEOUT_S`, else 408), and how many
connections are open at once (`MAX_CONNECTIONS`, else 503 at once). Nothing here blocks the event loop.

- `/healthz`: 200 whenever the event loop runs this handler, which is all liveness asks (a process whose
  loop is stuck never answers, and the kubelet restarts it). The body carries the uptime.
- `/readyz`: 200 when every check the service registered passes, else 503 with a JSON body naming each
  failing check and why. Checks run concurrently, each bounded by `check_timeout_s`, and their verdict is
  reused for `cache_s` (probes in a storm share one evaluation): a probe never hammers the database.

A route is one registration (`HealthServer.route(path, handler)`): a Prometheus `/metrics` is added the
same way as the two probes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any

from nats.aio.client import Client

log = logging.getLogger("devsched.service.health")

#: Largest request head (request line and headers) read; a probe's is about 200 bytes.
MAX_REQUEST_BYTES = 8192
#: How long a client may take to send its request head.
READ_TIMEOUT_S = 5.0
#: How long writing the response may take (a client that stops reading is dropped).
WRITE_TIMEOUT_S = 5.0
#: Connections served at once; more are answered 503 and closed.
MAX_CONNECTIONS = 64
#: After answering, how long and how much of what a client still sends is read before closing.
LINGER_S = 0.5
LINGER_BYTES = 64 * 1024
#: Longest reason kept from a failing check.
MAX_REASON_CHARS = 300


class NotReady(Exception):
    """A readiness check failed; the message says why (shown in `/readyz`'s body)."""


#: A readiness check: returns when it passes, raises (`NotReady` with a reason, or any error) when not.
Check = Callable[[], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class Response:
    """What a route answers."""

    status: int
    body: bytes
    content_type: str = "application/json"

    @classmethod
    def json(cls, status: int, data: Mapping[str, Any]) -> Response:
        """A JSON response."""
        return cls(status, json.dumps(data, separators=(",", ":")).encode() + b"\n")


#: A route's handler; it runs on the event loop, so it must not block.
Route = Callable[[], Awaitable[Response]]


def reason_of(exc: BaseException) -> str:
    """One bounded line saying why a check failed: its message, or the error's type and message."""
    if isinstance(exc, NotReady):
        text = str(exc)
    else:
        message = str(exc).strip()
        text = f"{type(exc).__name__}: {message}" if message else type(exc).__name__
    line = " ".join(text.split())
    return line if len(line) <= MAX_REASON_CHARS else line[: MAX_REASON_CHARS - 3] + "..."


@dataclass(frozen=True, slots=True)
class Verdict:
    """The outcome of one evaluation of every check: the reason of each failing one."""

    failing: Mapping[str, str]
    passing: tuple[str, ...]
    at: float = field(default_factory=time.monotonic)

    @property
    def ready(self) -> bool:
        """Whether every check passed."""
        return not self.failing

    def to_json(self) -> dict[str, Any]:
        """`{"ready": ..., "checks": {name: {"ok": true} | {"ok": false, "error": why}}}`."""
        checks: dict[str, dict[str, Any]] = {name: {"ok": True} for name in self.passing}
        checks.update({name: {"ok": False, "error": why} for name, why in self.failing.items()})
        return {"ready": self.ready, "checks": dict(sorted(checks.items()))}


class Readiness:
    """The named checks of one service, evaluated together and cached briefly."""

    def __init__(self, *, cache_s: float = 1.0, check_timeout_s: float = 3.0) -> None:
        self.cache_s = cache_s
        self.check_timeout_s = check_timeout_s
        self._checks: dict[str, Check] = {}
        self._last: Verdict | None = None
        self._running: asyncio.Future[Verdict] | None = None

    def add(self, name: str, check: Check) -> None:
        """Register `check` under `name` (a name used once)."""
        if name in self._checks:
            raise ValueError(f"readiness check {name!r} is registered already")
        self._checks[name] = check
        self._last = None

    @property
    def names(self) -> tuple[str, ...]:
        """The registered checks, in registration order."""
        return tuple(self._checks)

    async def verdict(self) -> Verdict:
        """Every check's outcome, evaluated at most once per `cache_s` (concurrent callers share one run)."""
        last = self._last
        if last is not None and time.monotonic() - last.at < self.cache_s:
            return last
        if self._running is None or self._running.done():
            self._running = asyncio.ensure_future(self._evaluate())
        # shielded: a probe that hangs up must not cancel the evaluation other probes wait for
        return await asyncio.shield(self._running)

    async def _evaluate(self) -> Verdict:
        names = list(self._checks)
        outcomes = await asyncio.gather(*(self._run(self._checks[name]) for name in names))
        failing = {name: why for name, why in zip(names, outcomes, strict=True) if why is not None}
        verdict = Verdict(failing=failing, passing=tuple(n for n in names if n not in failing))
        self._last = verdict
        return verdict

    async def _run(self, check: Check) -> str | None:
        try:
            async with asyncio.timeout(self.check_timeout_s):
                await check()
        except TimeoutError:
            return f"no answer within {self.check_timeout_s:g} s"
        except Exception as exc:  # a check's failure is its verdict, whatever it raised
            return reason_of(exc)
        return None


class HealthServer:
    """The HTTP listener of one service: `/healthz`, `/readyz` and whatever else is registered."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        service: str,
        readiness: Readiness | None = None,
        max_connections: int = MAX_CONNECTIONS,
        read_timeout_s: float = READ_TIMEOUT_S,
    ) -> None:
        self.host = host
        self.requested_port = port
        self.service = service
        self.readiness = readiness or Readiness()
        self.max_connections = max_connections
        self.read_timeout_s = read_timeout_s
        self._routes: dict[str, Route] = {}
        self._server: asyncio.Server | None = None
        self._connections: dict[asyncio.Task[Any], asyncio.StreamWriter] = {}
        self._started = time.monotonic()
        self.route("/healthz", self._healthz)
        self.route("/readyz", self._readyz)

    def route(self, path: str, handler: Route) -> None:
        """Serve GET `path` with `handler` (`/metrics` is registered this way)."""
        if not path.startswith("/"):
            raise ValueError(f"a route is an absolute path, not {path!r}")
        self._routes[path] = handler

    def check(self, name: str, check: Check) -> None:
        """Register a readiness check (`Readiness.add`)."""
        self.readiness.add(name, check)

    @property
    def port(self) -> int:
        """The port listened on (the one chosen by the system when 0 was asked for)."""
        if self._server is None or not self._server.sockets:
            return self.requested_port
        return int(self._server.sockets[0].getsockname()[1])

    async def start(self) -> None:
        """Listen; raises `OSError` when the address is unusable (taken, not local)."""
        self._started = time.monotonic()
        self._server = await asyncio.start_server(
            self._accept, self.host, self.requested_port, limit=MAX_REQUEST_BYTES, reuse_address=True
        )
        log.info("health endpoints listening", extra={"host": self.host, "port": self.port})

    async def close(self) -> None:
        """Stop listening and end the connections still open."""
        if self._server is None:
            return
        self._server.close()
        # Closing their sockets ends the connections' reads (cancelling them would make Python 3.11's
        # stream protocol log the cancellation as an error).
        for writer in self._connections.values():
            writer.close()
        if self._connections:
            _, late = await asyncio.wait(set(self._connections), timeout=2.0)
            for task in late:
                task.cancel()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._server.wait_closed(), timeout=2.0)
        self._server = None

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections[task] = writer
        try:
            if len(self._connections) > self.max_connections:
                response = Response.json(503, {"error": "too many connections"})
            else:
                response = await self._respond(reader)
            await self._send(writer, response)
            await _linger(reader, writer)
        except (ConnectionError, TimeoutError, asyncio.IncompleteReadError):
            pass  # the client went away or stalled: nothing to answer
        finally:
            self._connections.pop(task, None)
            writer.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(writer.wait_closed(), timeout=1.0)

    async def _respond(self, reader: asyncio.StreamReader) -> Response:
        try:
            async with asyncio.timeout(self.read_timeout_s):
                head = await reader.readuntil(b"\r\n\r\n")
        except TimeoutError:
            return Response.json(408, {"error": "request not received in time"})
        except asyncio.LimitOverrunError:
            return Response.json(431, {"error": f"request head above {MAX_REQUEST_BYTES} bytes"})
        except asyncio.IncompleteReadError as exc:
            if not exc.partial:
                raise  # connected and closed without a word (a TCP probe)
            return Response.json(400, {"error": "incomplete request"})
        parts = head.split(b"\r\n", 1)[0].split(b" ")
        if len(parts) != 3 or not parts[2].startswith(b"HTTP/1."):
            return Response.json(400, {"error": "not an HTTP/1.x request"})
        method, target = parts[0], parts[1].decode("ascii", "replace").split("?", 1)[0]
        handler = self._routes.get(target)
        if handler is None:
            return Response.json(404, {"error": "not found", "paths": sorted(self._routes)})
        if method != b"GET":
            return Response.json(405, {"error": "only GET is served"})
        try:
            return await handler()
        except Exception:
            log.exception("health route %s failed", target)
            return Response.json(500, {"error": "internal error"})

    async def _send(self, writer: asyncio.StreamWriter, response: Response) -> None:
        reason = HTTPStatus(response.status).phrase
        allow = "Allow: GET\r\n" if response.status == 405 else ""
        head = (
            f"HTTP/1.1 {response.status} {reason}\r\n"
            f"Content-Type: {response.content_type}\r\n"
            f"Content-Length: {len(response.body)}\r\n"
            f"Cache-Control: no-store\r\n{allow}"
            "Connection: close\r\n\r\n"
        )
        writer.write(head.encode("ascii") + response.body)
        async with asyncio.timeout(WRITE_TIMEOUT_S):
            await writer.drain()

    async def _healthz(self) -> Response:
        uptime = round(time.monotonic() - self._started, 3)
        return Response.json(200, {"status": "ok", "service": self.service, "uptime_s": uptime})

    async def _readyz(self) -> Response:
        verdict = await self.readiness.verdict()
        return Response.json(200 if verdict.ready else 503, {"service": self.service, **verdict.to_json()})


async def _linger(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Half-close, then read what the client still sends (bounded) before the close.

    A socket closed with unread input sends RST, which can destroy a response the client has not read yet.
    """
    if writer.can_write_eof():
        writer.write_eof()
    left = LINGER_BYTES
    with contextlib.suppress(TimeoutError, ConnectionError):
        async with asyncio.timeout(LINGER_S):
            while left > 0 and (chunk := await reader.read(min(left, 4096))):
                left -= len(chunk)


@contextlib.asynccontextmanager
async def serving_health(host: str, port: int | None, *, service: str) -> AsyncIterator[HealthServer | None]:
    """A started `HealthServer` for the block (closed after it), or None when `port` is None (off)."""
    if port is None:
        yield None
        return
    server = HealthServer(host, port, service=service)
    await server.start()
    try:
        yield server
    finally:
        await server.close()


async def check_nats(nc: Client | None, timeout: float = 2.0) -> None:  # noqa: ASYNC109
    """Pass when `nc` is connected and the server answers a PING (a flag alone can hide a dead socket).

    Raises:
        NotReady: not connected (yet, or any more), or no PONG within `timeout`.
    """
    if nc is None:
        raise NotReady("not connected yet")
    if not nc.is_connected:
        state = "closed" if nc.is_closed else "draining" if nc.is_draining else "reconnecting"
        raise NotReady(f"not connected ({state})")
    try:
        await nc.flush(timeout=timeout)  # type: ignore[arg-type]  # nats-py annotates it int
    except Exception as exc:
        raise NotReady(f"no answer from the server: {type(exc).__name__}") from None


async def plainly(work: Awaitable[None], *errors: type[Exception]) -> None:
    """Await `work`; an error of the types given fails the check with its message alone.

    For errors whose message is a whole sentence (the store's `DatabaseNotReady`): their type name adds nothing.
    """
    try:
        await work
    except errors as exc:
        raise NotReady(str(exc)) from None
