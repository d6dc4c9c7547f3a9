"""The health listener over real loopback sockets: probes, readiness verdicts, and what a bad client gets.

uvicorn serves it in the test's own loop, as in every service; what its HTTP stack answers (HEAD, a malformed
or oversized request, too many connections) and the deadlines added to it are checked here.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from starlette.requests import Request
from starlette.responses import Response

from devsched.service.health import (
    MAX_CONNECTIONS,
    MAX_REQUEST_BYTES,
    HealthServer,
    NotReady,
    Probes,
    Readiness,
    serving_health,
)
from support.polling import eventually
from support.probes import http, probe

pytestmark = pytest.mark.unit


async def get(port: int, path: str) -> tuple[int, Any]:
    return await probe(port, path)


@pytest.fixture
async def server() -> AsyncIterator[HealthServer]:
    health = HealthServer("127.0.0.1", 0, service="test", read_timeout_s=0.5)
    await health.start()
    yield health
    await health.close()


async def test_healthz_answers_with_the_uptime(server: HealthServer) -> None:
    status, body = await get(server.port, "/healthz")
    assert status == 200
    assert body["status"] == "ok"
    assert body["service"] == "test"
    assert body["uptime_s"] >= 0
    status, _ = await get(server.port, "/healthz?verbose=1")  # a query string is ignored
    assert status == 200


async def test_readyz_is_ready_only_when_every_check_passes(server: HealthServer) -> None:
    database_up = False

    async def nats() -> None:
        pass

    async def database() -> None:
        if not database_up:
            raise NotReady("password authentication failed")

    async def crashing() -> None:
        raise RuntimeError("boom\nsecond line")

    server.readiness.cache_s = 0
    server.check("nats", nats)
    server.check("database", database)
    status, body = await get(server.port, "/readyz")
    assert status == 503
    assert body == {
        "service": "test",
        "ready": False,
        "checks": {"database": {"ok": False, "error": "password authentication failed"}, "nats": {"ok": True}},
    }
    database_up = True
    status, body = await get(server.port, "/readyz")
    assert (status, body["ready"]) == (200, True)
    server.check("crashing", crashing)
    status, body = await get(server.port, "/readyz")
    assert status == 503
    assert body["checks"]["crashing"] == {"ok": False, "error": "RuntimeError: boom second line"}
    with pytest.raises(ValueError, match="registered already"):
        server.check("nats", nats)


async def test_unknown_paths_are_404_and_other_methods_405(server: HealthServer) -> None:
    status, body = await get(server.port, "/nope")
    assert status == 404
    assert body["paths"] == ["/healthz", "/readyz"]
    for method in ("POST", "DELETE", "PUT"):
        status, headers, _ = await http(server.port, f"{method} /healthz HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        assert status == 405, method
        assert set(headers["Allow"].split(", ")) == {"GET", "HEAD"}


async def test_head_is_answered_as_get_without_a_body(server: HealthServer) -> None:
    status, headers, body = await http(server.port, b"HEAD /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    assert (status, body) == (200, b"")
    assert headers["Content-Type"] == "application/json"
    assert int(headers["Content-Length"]) > 0  # the length GET's body has
    assert headers["Connection"] == "close"


@pytest.mark.parametrize(
    "raw",
    [
        b"GARBAGE\r\n\r\n",
        b"GET /healthz\r\n\r\n",
        b"GET /healthz HTTP/1.1\r\nNo colon here\r\n\r\n",
        b"GET /healthz HTTP/1.1\r\n\r\n",
    ],
    ids=["no request line", "no version", "bad header", "HTTP/1.1 without Host"],
)
async def test_a_malformed_request_is_400_and_the_next_one_is_served(server: HealthServer, raw: bytes) -> None:
    status, headers, _ = await http(server.port, raw)
    assert status == 400
    assert headers["Connection"] == "close"
    assert (await get(server.port, "/healthz"))[0] == 200


async def test_a_registered_route_is_served(server: HealthServer) -> None:
    async def metrics(request: Request) -> Response:
        return Response(b"devsched_up 1\n", media_type="text/plain; version=0.0.4; charset=utf-8")

    server.route("/metrics", metrics)
    status, headers, body = await http(server.port, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
    assert (status, headers["Content-Type"], body) == (
        200,
        "text/plain; version=0.0.4; charset=utf-8",
        b"devsched_up 1\n",
    )
    assert headers["Cache-Control"] == "no-store"
    with pytest.raises(ValueError, match="absolute path"):
        server.route("metrics", metrics)


async def test_a_route_that_fails_is_a_500_and_the_listener_serves_on(
    server: HealthServer, caplog: pytest.LogCaptureFixture
) -> None:
    async def broken(request: Request) -> Response:
        raise RuntimeError("a bug")

    server.route("/broken", broken)
    status, _, body = await http(server.port, b"GET /broken HTTP/1.1\r\nHost: x\r\n\r\n")
    assert (status, body) == (500, b'{"error":"internal error"}\n')
    assert any(r.exc_info and "a bug" in str(r.exc_info[1]) for r in caplog.records)  # uvicorn logged it
    assert (await get(server.port, "/healthz"))[0] == 200


async def test_an_oversized_request_is_refused(server: HealthServer) -> None:
    huge = b"GET /healthz HTTP/1.1\r\nX-Pad: " + b"a" * (MAX_REQUEST_BYTES * 4) + b"\r\n\r\n"
    status, _, _ = await http(server.port, huge)
    assert status == 400  # h11's limit on the head, answered by uvicorn
    assert (await get(server.port, "/healthz"))[0] == 200


async def test_a_slow_client_neither_blocks_others_nor_stays_forever(server: HealthServer) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(b"GET /hea")  # and then nothing more
    await writer.drain()
    try:
        started = time.monotonic()
        status, _ = await get(server.port, "/healthz")  # served while the slow one waits
        assert status == 200
        assert time.monotonic() - started < 0.4
        async with asyncio.timeout(5):
            answer = await reader.read()  # the server gives up on it after its read timeout
        assert answer.startswith(b"HTTP/1.1 408 ")
        assert answer.endswith(b'{"error":"request not received in time"}\n')
    finally:
        writer.close()


async def test_a_client_that_never_reads_its_answer_is_cut_off() -> None:
    health = HealthServer("127.0.0.1", 0, service="test", read_timeout_s=0.3, write_timeout_s=0.3)
    big = b"x" * (64 * 1024 * 1024)  # far more than the socket buffers hold: the write waits for the reader

    async def huge(request: Request) -> Response:
        return Response(big, media_type="text/plain")

    health.route("/huge", huge)
    await health.start()
    _, writer = await asyncio.open_connection("127.0.0.1", health.port)
    try:
        writer.write(b"GET /huge HTTP/1.1\r\nHost: x\r\n\r\n")  # and never a read
        await writer.drain()
        await eventually(lambda: health.connections == 1, message="the request is being answered")
        started = time.monotonic()
        await eventually(lambda: health.connections == 0, timeout=10, message="the stalled reader is cut off")
        assert time.monotonic() - started < 6  # 0.6 s of deadlines, and a loaded machine copying 64 MiB
        assert (await get(health.port, "/healthz"))[0] == 200
    finally:
        writer.close()
        await health.close()


async def test_an_answer_slower_than_the_read_deadline_is_not_cut_short() -> None:
    health = HealthServer("127.0.0.1", 0, service="test", read_timeout_s=0.3, write_timeout_s=2.0)

    async def slow(request: Request) -> Response:
        await asyncio.sleep(0.8)  # past the deadline for the request head, which came in time
        return Response(b"done\n", media_type="text/plain")

    health.route("/slow", slow)
    await health.start()
    try:
        status, _, body = await http(health.port, b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
        assert (status, body) == (200, b"done\n")
    finally:
        await health.close()


async def test_a_slow_readiness_check_holds_only_its_own_probe() -> None:
    readiness = Readiness(cache_s=0, check_timeout_s=1.0)
    health = HealthServer("127.0.0.1", 0, service="test", probes=Probes("test", readiness))

    async def slow() -> None:
        await asyncio.sleep(60)

    health.check("database", slow)
    await health.start()
    try:
        pending = asyncio.create_task(get(health.port, "/readyz"))
        await eventually(lambda: health.connections == 1, message="/readyz waits on its check")
        started = time.monotonic()
        assert (await get(health.port, "/healthz"))[0] == 200
        assert time.monotonic() - started < 0.5
        status, body = await pending
        assert (status, body["checks"]["database"]) == (503, {"ok": False, "error": "no answer within 1 s"})
    finally:
        await health.close()


async def test_a_storm_of_probes_is_answered_and_the_checks_run_once(server: HealthServer) -> None:
    calls = 0

    async def counted() -> None:
        nonlocal calls
        calls += 1
        await asyncio.sleep(0.2)

    server.readiness.cache_s = 30
    server.check("database", counted)
    paths = ["/readyz", "/healthz"] * (MAX_CONNECTIONS // 2 - 2)
    started = time.monotonic()
    answers = await asyncio.gather(*(get(server.port, path) for path in paths))
    assert [status for status, _ in answers] == [200] * len(paths)
    assert calls == 1
    assert time.monotonic() - started < 5


async def test_connections_above_the_limit_are_turned_away() -> None:
    health = HealthServer("127.0.0.1", 0, service="test", max_connections=2, read_timeout_s=5)
    await health.start()
    idle = [await asyncio.open_connection("127.0.0.1", health.port) for _ in range(2)]
    try:
        await eventually(lambda: health.connections == 2, message="two idle connections held")
        status, _, _ = await http(health.port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert status == 503
    finally:
        for _, writer in idle:
            writer.close()
        await health.close()
    with pytest.raises(ConnectionRefusedError):  # closed: nothing listens any more
        await http(health.port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")


async def test_serving_health_is_off_without_a_port_and_listens_with_one() -> None:
    async with serving_health("127.0.0.1", None, service="test") as off:
        assert off is None
    async with serving_health("127.0.0.1", 0, service="test") as on:
        assert on is not None
        assert (await get(on.port, "/healthz"))[0] == 200


async def test_a_taken_port_is_an_error_at_start() -> None:
    async with serving_health("127.0.0.1", 0, service="first") as first:
        assert first is not None
        with pytest.raises(OSError, match="in use"):
            await HealthServer("127.0.0.1", first.port, service="second").start()
        assert (await get(first.port, "/healthz"))[1]["service"] == "first"


async def test_the_listener_leaves_the_signals_to_the_service() -> None:
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    async with serving_health("127.0.0.1", 0, service="test") as on:
        assert on is not None
        assert {sig: signal.getsignal(sig) for sig in before} == before
    assert {sig: signal.getsignal(sig) for sig in before} == before


async def test_close_is_bounded_while_an_answer_hangs() -> None:
    health = HealthServer("127.0.0.1", 0, service="test")

    async def hangs(request: Request) -> Response:
        await asyncio.sleep(60)
        return Response(b"")

    health.route("/hangs", hangs)
    await health.start()
    _, writer = await asyncio.open_connection("127.0.0.1", health.port)
    try:
        writer.write(b"GET /hangs HTTP/1.1\r\nHost: x\r\n\r\n")
        await writer.drain()
        await eventually(lambda: health.connections == 1, message="the request is being answered")
        started = time.monotonic()
        await health.close()
        assert time.monotonic() - started < 4
    finally:
        writer.close()
    with pytest.raises(ConnectionRefusedError):
        await http(health.port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
