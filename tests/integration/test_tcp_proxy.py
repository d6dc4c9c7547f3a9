"""The fault suite's TCP proxy itself: each fault does what it says, against an echo server and a real NATS."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

import nats
import nats.errors
import pytest

from support.tcp_proxy import Frame, TcpProxy, _FrameCutter, deliveries, replies_to

pytestmark = pytest.mark.integration


@pytest.fixture
async def echo() -> AsyncIterator[tuple[str, int]]:
    """A TCP echo server on a free loopback port."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError):
            while data := await reader.read(4096):
                writer.write(data)
                await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    yield "127.0.0.1", server.sockets[0].getsockname()[1]
    server.close()
    await server.wait_closed()


async def _round_trip(port: int, data: bytes = b"ping", timeout: float = 2.0) -> tuple[bytes, float]:  # noqa: ASYNC109
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        started = time.monotonic()
        writer.write(data)
        got = await asyncio.wait_for(reader.readexactly(len(data)), timeout)
        return got, time.monotonic() - started
    finally:
        writer.close()


async def test_passes_bytes_and_delays_them(echo: tuple[str, int]) -> None:
    async with TcpProxy(echo) as proxy:
        got, fast = await _round_trip(proxy.port)
        assert got == b"ping"
        proxy.delay(0.2, 0.1)
        _, slow = await _round_trip(proxy.port)
        assert 0.1 <= slow < 1.0  # one leg of 100-300 ms
        proxy.delay(0.2, 0.1, both_ways=True)
        _, slower = await _round_trip(proxy.port)
        assert 0.2 <= slower < 1.5  # two legs
        assert fast < slow


async def test_blackhole_keeps_connections_open_and_silent_until_heal_resets_them(echo: tuple[str, int]) -> None:
    async with TcpProxy(echo) as proxy:
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        writer.write(b"a")
        assert await reader.readexactly(1) == b"a"
        proxy.blackhole()
        writer.write(b"b")
        await writer.drain()  # accepted by the kernel: nothing tells the client the far side is gone
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(reader.read(1), 0.5)
        with pytest.raises(TimeoutError):  # a new connection opens and nothing answers it either
            await _round_trip(proxy.port, timeout=0.5)
        proxy.heal()
        with pytest.raises(ConnectionResetError):
            await asyncio.wait_for(reader.read(1), 2)
        writer.close()
        assert (await _round_trip(proxy.port))[0] == b"ping"
        assert proxy.counts["resets"] >= 1


async def test_reset_sends_an_rst_on_open_connections(echo: tuple[str, int]) -> None:
    async with TcpProxy(echo) as proxy:
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        writer.write(b"a")
        await reader.readexactly(1)
        proxy.reset()
        with pytest.raises(ConnectionResetError):
            await asyncio.wait_for(reader.read(1), 2)
        writer.close()
        assert (await _round_trip(proxy.port))[0] == b"ping"


def test_frames_are_cut_whole_across_chunks() -> None:
    cutter = _FrameCutter()
    stream = b"PING\r\nMSG a.b 1 _INBOX.x 5\r\nhello\r\nHMSG c 2 $JS.ACK.S.C.2.5.5.1.0 12 14\r\nNATS/1.0\r\n\r\nhi\r\n"
    frames = [f for i in range(0, len(stream), 7) for f in cutter.feed(stream[i : i + 7])]
    assert [(f.op, f.subject, f.reply) for f in frames] == [
        ("PING", "", None),
        ("MSG", "a.b", "_INBOX.x"),
        ("HMSG", "c", "$JS.ACK.S.C.2.5.5.1.0"),
    ]
    assert b"".join(f.raw for f in frames) == stream
    assert frames[2].delivery == 2
    status = _FrameCutter().feed(b"HMSG _INBOX.h.1 3 28 28\r\nNATS/1.0 404 No Messages\r\n\r\n\r\n")
    assert [f.status for f in status] == [404]
    assert not replies_to("_INBOX.h.")(status[0])
    assert frames[2].status is None
    assert Frame("MSG", b"", "_INBOX.h.1").delivery is None


async def test_nats_replies_are_dropped_and_deliveries_recognised(nats_url: str, subject_prefix: str) -> None:
    host, port = nats_url.removeprefix("nats://").split(":")
    async with TcpProxy((host, int(port)), nats=True) as proxy:
        responder = await nats.connect(nats_url)
        client = await nats.connect(proxy.url(), inbox_prefix="_INBOX.h1")
        try:

            async def answer(msg: nats.aio.msg.Msg) -> None:
                await msg.respond(b"pong")

            await responder.subscribe(f"{subject_prefix}.echo", cb=answer)
            await responder.flush()
            assert (await client.request(f"{subject_prefix}.echo", b"x", timeout=2)).data == b"pong"
            proxy.drop_when(replies_to("_INBOX.h1."))
            with pytest.raises(nats.errors.TimeoutError):
                await client.request(f"{subject_prefix}.echo", b"x", timeout=0.5)
            assert proxy.counts["dropped"] == 1
            assert not deliveries()(Frame("MSG", b"", "_INBOX.h1.x"))
            proxy.heal()
            assert (await client.request(f"{subject_prefix}.echo", b"x", timeout=2)).data == b"pong"
        finally:
            await client.close()
            await responder.close()
