"""The client's one JetStream reader (`devsched.client.reader`) against a real nats-server with the deploy
accounts, read as the confined `web` user: what is stored, a stream that is missing, a consumer lost and
made again by name (its filter still in the create request, which is all the user may send for a logs
stream), and the teardown that leaves no consumer behind.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from pathlib import Path

import nats
import nats.js.errors
import pytest
from nats.aio.client import Client as NatsClient

from devsched.client import reader
from devsched.client.reader import INACTIVE_THRESHOLD_S, NAME_PREFIX, JetStreamReader, StreamMissing
from devsched.protocol import messages as m
from devsched.protocol.codec import encode
from devsched.protocol.subjects import Subjects
from devsched.scheduler.jetstream import ensure_host_streams, ensure_streams
from devsched.scheduler.settings import SchedulerSettings
from support.polling import eventually
from support.scheduler_harness import BUDGETS
from support.secured_nats import SecuredNats, secured_nats

pytestmark = pytest.mark.integration

S = Subjects("devsched")


@pytest.fixture
def secured(tmp_path: Path) -> Iterator[SecuredNats]:
    with secured_nats(tmp_path / "nats") as server:
        yield server


@pytest.fixture
async def scheduler(secured: SecuredNats) -> AsyncIterator[NatsClient]:
    """The scheduler's user, with the streams made as it makes them (host bench-07 registered)."""
    nc = await nats.connect(secured.url("scheduler"))
    settings = SchedulerSettings(subject_prefix="devsched", **BUDGETS)
    await ensure_streams(nc.jetstream(), S, settings)
    await ensure_host_streams(nc.jetstream(), S, settings, "bench-07")
    yield nc
    await nc.close()


@pytest.fixture
async def web(secured: SecuredNats, scheduler: NatsClient) -> AsyncIterator[tuple[NatsClient, list[str]]]:
    """The dashboard's user, and the errors the server sent it (a refused request shows here)."""
    refused: list[str] = []

    async def on_error(exc: Exception) -> None:
        refused.append(str(exc))

    nc = await nats.connect(secured.url("web"), error_cb=on_error, allow_reconnect=False)
    yield nc, refused
    await nc.close()


def _event(task: uuid.UUID, seq: int) -> bytes:
    return encode(m.TaskEvent(event="submitted", task_id=task, seq=seq, status="queued", at=datetime.now(UTC)))


async def test_stored_reads_what_the_stream_holds_and_stops(
    web: tuple[NatsClient, list[str]], scheduler: NatsClient
) -> None:
    nc, refused = web
    task, other = uuid.uuid4(), uuid.uuid4()
    for seq in (1, 2, 3):
        await scheduler.jetstream().publish(S.task_events(task), _event(task, seq))
    await scheduler.jetstream().publish(S.task_events(other), _event(other, 1))
    reader = JetStreamReader(nc.jetstream())

    started = time.monotonic()
    found = await reader.stored(S.events_stream, S.task_events(task), wait=30.0, most=100)
    assert [m.TaskEvent.model_validate_json(msg.data).seq for msg in found] == [1, 2, 3]
    assert await reader.stored(S.events_stream, S.task_events(uuid.uuid4()), wait=30.0, most=100) == []
    assert await reader.stored(S.events_stream, S.task_events(task), wait=30.0, most=2) != []
    assert time.monotonic() - started < 10.0, "nothing pending ends the read: it never waits out `wait`"

    with pytest.raises(StreamMissing):
        await reader.open(S.host_logs_stream("bench-99"), S.host_log("bench-99", task, 1))
    assert refused == []


async def test_a_lost_consumer_is_made_again_by_name_with_its_filter(
    secured: SecuredNats, web: tuple[NatsClient, list[str]], scheduler: NatsClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The web user may create a logs consumer only through a request naming a log filter: the
    recreation after lost heartbeats must name it too, or the rest of the output never comes."""
    monkeypatch.setattr(reader, "IDLE_HEARTBEAT_S", 1.0)  # two missed heartbeats in 2 s, not 10
    nc, refused = web
    task = uuid.uuid4()
    subject, stream = S.host_log("bench-07", task, 1), S.host_logs_stream("bench-07")
    host = await nats.connect(secured.url("bench-07"), inbox_prefix="_INBOX.bench-07")
    try:
        await host.jetstream().publish(subject, b"first")
        async with await JetStreamReader(nc.jetstream()).open(stream, subject) as ordered:
            assert ordered.stored == 1
            first = await ordered.next(10.0)
            assert first is not None
            assert first.data == b"first"
            lost = ordered.consumer
            assert lost is not None
            assert lost.startswith(NAME_PREFIX)

            await scheduler.jetstream().delete_consumer(stream, lost)  # gone: no heartbeat comes any more
            await host.jetstream().publish(subject, b"second")
            second = await ordered.next(40.0)  # two heartbeats missed, then made again
            assert second is not None, "the reader did not recover its consumer"
            assert second.data == b"second"
            # nats-py names the new consumer when its create reply comes, which may be after its first message
            made = await eventually(
                lambda: ordered.consumer if ordered.consumer not in (None, lost) else None,
                timeout=10.0,
                message="the reader never named its new consumer",
            )
            assert made.startswith(NAME_PREFIX)
            assert await ordered.next(1.0) is None, "nothing twice"
    finally:
        await host.close()
    assert refused == []


async def test_a_closed_reader_leaves_no_consumer(web: tuple[NatsClient, list[str]], scheduler: NatsClient) -> None:
    nc, refused = web
    task = uuid.uuid4()
    await scheduler.jetstream().publish(S.task_events(task), _event(task, 1))
    ordered = await JetStreamReader(nc.jetstream()).open(S.events_stream, S.task_events(task))
    name = ordered.consumer
    assert name is not None
    assert (await nc.jetstream().consumer_info(S.events_stream, name)).config.filter_subject == S.task_events(task)
    await ordered.close()
    await ordered.close()  # idempotent
    assert ordered.consumer is None

    async def gone() -> bool:
        try:
            await nc.jetstream().consumer_info(S.events_stream, name)
        except nats.js.errors.NotFoundError:
            return True
        return False

    await eventually(gone, timeout=INACTIVE_THRESHOLD_S + 10.0, interval=0.5, message="the server drops it")
    assert refused == []
