"""A host's account names no request verb, yet reaches only its own subjects.

A host block imports `P.host.<id>.*` (the verb a wildcard, the host id pinned) from the devsched account's
export `P.host.*.*`, so a host endpoint added later reaches the scheduler without any host's block being
generated again. Proven against a real nats-server with the deploy accounts: a verb no block names goes
through and is answered, another host's verbs and the host's own nudge are refused, and a nudge reaches its
host once (the nudge's stream import and the requests' service import share the host's subjects).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import nats
import pytest
from nats.aio.msg import Msg

from support.polling import eventually
from support.secured_nats import SecuredNats, account_host, secured_nats

pytestmark = [pytest.mark.security, pytest.mark.integration]

#: A verb that no endpoint has today, as a later release would add.
NEW_VERB = "calibrate"


@pytest.fixture
def secured(tmp_path: Path) -> Iterator[SecuredNats]:
    with secured_nats(tmp_path / "nats") as server:
        yield server


async def test_a_verb_no_block_names_reaches_the_scheduler_and_is_answered(secured: SecuredNats) -> None:
    scheduler = await nats.connect(secured.url("scheduler"))
    _, connection = await account_host(secured, "bench-07")
    assert connection.nc is not None
    try:
        seen: list[str] = []

        async def answer(msg: Msg) -> None:
            seen.append(msg.subject)
            await msg.respond(b"ok")

        await scheduler.subscribe("devsched.host.*.*", cb=answer)
        await scheduler.flush()
        reply = await connection.nc.request(f"devsched.host.bench-07.{NEW_VERB}", b"{}", timeout=5.0)
        assert reply.data == b"ok"
        assert seen == [f"devsched.host.bench-07.{NEW_VERB}"], "it arrives under the host's own id"
        assert connection.violations == []
    finally:
        await connection.nc.close()
        await scheduler.close()


async def test_a_host_reaches_no_other_hosts_verbs_and_cannot_nudge(secured: SecuredNats) -> None:
    scheduler = await nats.connect(secured.url("scheduler"))
    _, connection = await account_host(secured, "bench-07")
    assert connection.nc is not None
    try:
        seen: list[str] = []

        async def record(msg: Msg) -> None:
            seen.append(msg.subject)

        await scheduler.subscribe("devsched.host.*.*", cb=record)
        await scheduler.flush()
        for subject in (
            f"devsched.host.bench-08.{NEW_VERB}",
            "devsched.host.bench-08.register",
            "devsched.host.bench-07.nudge",
            "devsched.host.bench-07.x.y",
        ):
            await connection.refused_publish(subject)
        # Then one the host may send: had any refused one gone through, it would have arrived before it.
        marker = f"devsched.host.bench-07.{NEW_VERB}"
        await connection.nc.publish(marker, b"{}")
        await connection.nc.flush()
        await eventually(lambda: marker in seen, timeout=5.0, message="the host's own request arrives")
        assert seen == [marker]
    finally:
        await connection.nc.close()
        await scheduler.close()


async def test_a_nudge_reaches_its_host_once_and_no_other(secured: SecuredNats) -> None:
    scheduler = await nats.connect(secured.url("scheduler"))
    _, bench07 = await account_host(secured, "bench-07")
    _, bench08 = await account_host(secured, "bench-08")
    assert bench07.nc is not None
    assert bench08.nc is not None
    try:
        got: dict[str, list[bytes]] = {"bench-07": [], "bench-08": [], "scheduler": []}

        def collect(into: list[bytes]) -> Callable[[Msg], Awaitable[None]]:
            async def cb(msg: Msg) -> None:
                into.append(msg.data)

            return cb

        await bench07.nc.subscribe("devsched.host.bench-07.nudge", cb=collect(got["bench-07"]))
        await bench08.nc.subscribe("devsched.host.bench-08.nudge", cb=collect(got["bench-08"]))
        await scheduler.subscribe("devsched.host.*.*", cb=collect(got["scheduler"]))
        for nc in (bench07.nc, bench08.nc, scheduler):
            await nc.flush()
        await scheduler.publish("devsched.host.bench-07.nudge", b"n1")
        await scheduler.flush()
        await eventually(lambda: got["bench-07"] == [b"n1"], timeout=5.0, message="bench-07 is nudged")
        # A second nudge, then a last one to bench-08 as a fence: the server has sent everything before it.
        await scheduler.publish("devsched.host.bench-07.nudge", b"n2")
        await scheduler.publish("devsched.host.bench-08.nudge", b"fence")
        await scheduler.flush()
        await eventually(lambda: got["bench-08"] == [b"fence"], timeout=5.0, message="bench-08 is nudged")
        # bench-07's and bench-08's connections deliver apart: the fence says the server sent n2, not that
        # bench-07's client has read it yet
        await eventually(lambda: len(got["bench-07"]) >= 2, timeout=5.0, message="bench-07 is nudged again")
        await eventually(lambda: len(got["scheduler"]) == 3, timeout=5.0, message="the scheduler sees its own")
        assert got["bench-07"] == [b"n1", b"n2"], "each nudge once: it does not loop back through the imports"
        assert got["scheduler"] == [b"n1", b"n2", b"fence"]
        assert bench07.violations == []
    finally:
        await bench07.nc.close()
        await bench08.nc.close()
        await scheduler.close()
