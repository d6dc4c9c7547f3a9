"""A host's NATS account bounds what the host can hold of the server: connections, subscriptions, payload.

Proven against a real nats-server with the deploy accounts (deploy/nats/accounts.conf, host_user.py's
`HOST_LIMITS`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Iterator
from pathlib import Path

import nats
import nats.errors
import pytest

from support.polling import eventually
from support.secured_nats import USERS, SecuredNats, host_user_module, secured_nats

pytestmark = [pytest.mark.security, pytest.mark.integration]

LIMITS = host_user_module().HOST_LIMITS


@pytest.fixture
def secured(tmp_path: Path) -> Iterator[SecuredNats]:
    with secured_nats(tmp_path / "nats") as server:
        yield server


async def _answer(address: str, role: str, subscriptions: int = 0) -> str:
    """Open a raw NATS connection as `role`, subscribe `subscriptions` subjects, PING; the server's answer.

    Raw protocol rather than nats-py, whose client leaves its socket open when the server refuses it.
    """
    host, port = address.split(":")
    user, password = USERS[role]
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        await reader.readline()  # INFO
        connect = {"user": user, "pass": password, "verbose": False, "pedantic": False, "protocol": 1}
        lines = [f"CONNECT {json.dumps(connect)}\r\n"]
        lines += [f"SUB _INBOX.bench-07.s{i} {i}\r\n" for i in range(subscriptions)]
        writer.write(("".join(lines) + "PING\r\n").encode())
        await writer.drain()
        async with asyncio.timeout(10):
            while True:
                line = (await reader.readline()).decode().strip()
                if line != "PING":  # the server's own keep-alive
                    return line
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()


async def test_a_host_holds_at_most_its_connections(secured: SecuredNats) -> None:
    held = [await nats.connect(secured.url("bench-07")) for _ in range(LIMITS["max_connections"])]
    try:
        answer = await _answer(secured.address, "bench-07")
        assert answer.lower() == "-err 'maximum account active connections exceeded'"
        assert await _answer(secured.address, "bench-08") == "PONG", "another host is not affected"
    finally:
        for nc in held:
            await nc.close()

    async def admitted() -> bool:
        return await _answer(secured.address, "bench-07") == "PONG"

    await eventually(admitted, message="a closed connection frees its place")


async def test_a_host_holds_at_most_its_subscriptions(secured: SecuredNats) -> None:
    limit = LIMITS["max_subscriptions"]
    assert await _answer(secured.address, "bench-07", limit) == "PONG"
    answer = await _answer(secured.address, "bench-07", limit + 1)
    assert answer.lower() == "-err 'maximum subscriptions exceeded'"


async def test_a_host_cannot_send_more_than_its_payload_limit(secured: SecuredNats) -> None:
    nc = await nats.connect(secured.url("bench-07"))
    try:
        assert nc.max_payload == LIMITS["max_payload"]
        with pytest.raises(nats.errors.MaxPayloadError):
            await nc.publish("devsched.host.bench-07.report", b"x" * (LIMITS["max_payload"] + 1))
    finally:
        await nc.close()
