"""The health listener over real loopback sockets: probes, readiness verdicts, and what a bad client gets."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from devsched.service.health import MAX_REQUEST_BYTES, HealthServer, NotReady, Readiness, Response, serving_health
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


async def test_a_check_that_hangs_fails_within_its_timeout() -> None:
    readiness = Readiness(cache_s=0, check_timeout_s=0.2)

    async def hangs() -> None:
        await asyncio.sleep(60)

    readiness.add("database", hangs)
    started = time.monotonic()
    verdict = await readiness.verdict()
    assert time.monotonic() - started < 2
    assert verdict.failing == {"database": "no answer within 0.2 s"}


async def test_a_probe_storm_runs_the_checks_once_per_cache_period() -> None:
    calls = 0

    async def counted() -> None:
        nonlocal calls
        calls += 1
        await asyncio.sleep(0.05)

    readiness = Readiness(cache_s=30)
    readiness.add("database", counted)
    verdicts = await asyncio.gather(*(readiness.verdict() for _ in range(50)))
    assert all(v.ready for v in verdicts)
    assert calls == 1
    await readiness.verdict()
    assert calls == 1
    readiness.cache_s = 0
    await readiness.verdict()
    assert calls == 2


async def test_unknown_paths_are_404_and_other_methods_405(server: HealthServer) -> None:
    status, body = await get(server.port, "/nope")
    assert status == 404
    assert body["paths"] == ["/healthz", "/readyz"]
    for method in ("POST", "HEAD", "DELETE", "PUT"):
        status, headers, _ = await http(server.port, f"{method} /healthz HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        assert status == 405, method
        assert headers["Allow"] == "GET"
    status, _, _ = await http(server.port, b"GARBAGE\r\n\r\n")
    assert status == 400


async def test_a_registered_route_is_served(server: HealthServer) -> None:
    async def metrics() -> Response:
        return Response(200, b"devsched_up 1\n", "text/plain; version=0.0.4")

    server.route("/metrics", metrics)
    status, headers, body = await http(server.port, b"GET /metrics HTTP/1.1\r\n\r\n")
    assert (status, headers["Content-Type"], body) == (200, "text/plain; version=0.0.4", b"devsched_up 1\n")


async def test_an_oversized_request_is_refused(server: HealthServer) -> None:
    huge = b"GET /healthz HTTP/1.1\r\nX-Pad: " + b"a" * (MAX_REQUEST_BYTES * 4) + b"\r\n\r\n"
    status, _, body = await http(server.port, huge)
    assert status == 431
    assert b"bytes" in body


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
    finally:
        writer.close()


async def test_connections_above_the_limit_are_turned_away() -> None:
    health = HealthServer("127.0.0.1", 0, service="test", max_connections=2, read_timeout_s=5)
    await health.start()
    idle = [await asyncio.open_connection("127.0.0.1", health.port) for _ in range(2)]
    try:
        await eventually(lambda: len(health._connections) == 2, message="two idle connections held")
        status, _, _ = await http(health.port, b"GET /healthz HTTP/1.1\r\n\r\n")
        assert status == 503
    finally:
        for _, writer in idle:
            writer.close()
        await health.close()
    with pytest.raises(ConnectionRefusedError):  # closed: nothing listens any more
        await http(health.port, b"GET /healthz HTTP/1.1\r\n\r\n")


async def test_serving_health_is_off_without_a_port_and_listens_with_one() -> None:
    async with serving_health("127.0.0.1", None, service="test") as off:
        assert off is None
    async with serving_health("127.0.0.1", 0, service="test") as on:
        assert on is not None
        assert (await get(on.port, "/healthz"))[0] == 200
