"""The client's `LogReader` against a real nats-server: order by seq, repeats dropped, the host named by the
task view only, following to the end record or to a quiet end of an attempt that is over."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import pytest
from nats.aio.client import Client as NatsClient
from nats.js.api import StreamConfig

from devsched.client import NotFound
from devsched.client.logs import LogReader
from devsched.core.status import Outcome
from devsched.protocol import messages as m
from devsched.protocol.codec import encode
from devsched.protocol.logs import LogKind, LogRecord, OutputStream
from devsched.protocol.subjects import MSG_ID_HEADER, Subjects, log_msg_id
from devsched.scheduler.jetstream import retire_shared_streams
from support.log_stream import logs_stream, task_view
from support.polling import eventually

pytestmark = pytest.mark.integration

HOST = "h1"
LEASE = uuid.uuid4()


@pytest.fixture
def subjects(subject_prefix: str) -> Subjects:
    return Subjects(subject_prefix)


@pytest.fixture
async def stream(nc: NatsClient, subjects: Subjects) -> AsyncIterator[str]:
    async with logs_stream(nc, subjects) as name:
        yield name


def line(task: uuid.UUID, seq: int, text: str, *, attempt: int = 1, step: str = "s") -> LogRecord:
    return LogRecord(
        task_id=task,
        attempt=attempt,
        seq=seq,
        kind=LogKind.OUTPUT,
        at=datetime.now(UTC),
        offset=0,
        step=step,
        index=0,
        stream=OutputStream.STDOUT,
        encoding="utf-8",
        data=text,
    )


def end(task: uuid.UUID, seq: int, *, attempt: int = 1) -> LogRecord:
    return LogRecord(
        task_id=task, attempt=attempt, seq=seq, kind=LogKind.END, at=datetime.now(UTC), offset=0, outcome=Outcome.DONE
    )


async def publish(
    nc: NatsClient,
    subjects: Subjects,
    record: LogRecord,
    *,
    host: str = HOST,
    lease: uuid.UUID | None = None,
    attempt: int | None = None,
) -> None:
    """Publish as a host does: on `host`'s subject of the record's attempt (or of `attempt`), with the Msg-Id
    of the attempt's lease (each attempt has its own)."""
    number = attempt or record.attempt
    subject = subjects.host_log(host, record.task_id, number)
    lease = lease or uuid.uuid5(LEASE, f"{record.task_id}.{number}")
    await nc.jetstream().publish(subject, encode(record), headers={MSG_ID_HEADER: log_msg_id(lease, record.seq)})


class Task:
    """A task view the test changes as the task goes on."""

    def __init__(self, task_id: uuid.UUID, *attempts: tuple[int, str], status: str = "dispatched") -> None:
        self.view = task_view(task_id, HOST, *attempts, status=status)

    def set(self, *attempts: tuple[int, str], status: str) -> None:
        self.view = task_view(self.view.task_id, HOST, *attempts, status=status)

    async def probe(self) -> m.TaskView:
        return self.view


def reader(nc: NatsClient, subjects: Subjects, task: Task, **options: object) -> LogReader:
    return LogReader(
        nc.jetstream(),
        subjects,
        task.view.task_id,
        task.probe,
        idle_check_s=0.3,
        quiet_grace_s=0.3,
        **options,  # type: ignore[arg-type]
    )


async def texts(log: LogReader) -> list[str]:
    async with log:
        return [r.data or r.kind.value async for r in log]


async def test_records_come_in_seq_order_once_each(nc: NatsClient, subjects: Subjects, stream: str) -> None:
    task = Task(uuid.uuid4(), (1, "done"), status="done")
    tid = task.view.task_id
    # stored out of order (a retried publish), and twice (a publish retried past the duplicate window)
    for seq, text in [(2, "b"), (1, "a"), (4, "d"), (3, "c"), (3, "c")]:
        record = line(tid, seq, text)
        subject = subjects.host_log(HOST, tid, 1)
        await nc.jetstream().publish(subject, encode(record))  # no Msg-Id: the repeat is stored too
    await publish(nc, subjects, end(tid, 5))
    assert await texts(reader(nc, subjects, task)) == ["a", "b", "c", "d", "end"]


async def test_only_the_attempts_own_host_is_read(nc: NatsClient, subjects: Subjects, stream: str) -> None:
    task = Task(uuid.uuid4(), (1, "done"), status="done")
    tid = task.view.task_id
    await publish(nc, subjects, line(tid, 1, "mine"))
    # another host knows the task (it ran an earlier attempt) but not this attempt's lease
    async with logs_stream(nc, subjects, "h2"):
        await publish(nc, subjects, line(tid, 2, "injected by another host"), host="h2", lease=uuid.uuid4())
        await publish(nc, subjects, line(tid, 2, "wrong attempt in the body", attempt=2), attempt=1, lease=uuid.uuid4())
        await publish(nc, subjects, end(tid, 2))
        assert await texts(reader(nc, subjects, task)) == ["mine", "end"]


async def test_attempts_and_steps_are_chosen(nc: NatsClient, subjects: Subjects, stream: str) -> None:
    task = Task(uuid.uuid4(), (1, "expired"), (2, "done"), status="done")
    tid = task.view.task_id
    await publish(nc, subjects, line(tid, 1, "first try"))
    await publish(nc, subjects, line(tid, 1, "second try, a", attempt=2, step="a"))
    await publish(nc, subjects, line(tid, 2, "second try, b", attempt=2, step="b"))
    await publish(nc, subjects, end(tid, 3, attempt=2))
    assert await texts(reader(nc, subjects, task)) == ["second try, a", "second try, b", "end"], "the latest"
    assert await texts(reader(nc, subjects, task, attempt=1)) == ["first try"]
    assert await texts(reader(nc, subjects, task, step="b")) == ["second try, b", "end"]
    with pytest.raises(NotFound):
        await texts(reader(nc, subjects, task, attempt=3))


async def test_nothing_stored_reads_as_nothing(nc: NatsClient, subjects: Subjects, stream: str) -> None:
    assert await texts(reader(nc, subjects, Task(uuid.uuid4(), (1, "active")))) == []
    assert await texts(reader(nc, subjects, Task(uuid.uuid4(), status="queued"))) == [], "no attempt yet"


async def test_follow_yields_records_as_they_come_and_ends_at_the_end_record(
    nc: NatsClient, subjects: Subjects, stream: str
) -> None:
    task = Task(uuid.uuid4(), (1, "active"))
    tid = task.view.task_id
    seen: list[str] = []

    async def follow() -> None:
        async with reader(nc, subjects, task, follow=True) as log:
            async for record in log:
                seen.append(record.data or record.kind.value)

    following = asyncio.create_task(follow())
    await publish(nc, subjects, line(tid, 1, "one"))
    await eventually(lambda: seen == ["one"], message="the first line while the attempt runs")
    await publish(nc, subjects, line(tid, 2, "two"))
    await eventually(lambda: seen == ["one", "two"], message="the second line")
    await asyncio.sleep(0.8)  # longer than the idle check: the attempt is still active, so it goes on
    assert not following.done()
    await publish(nc, subjects, end(tid, 3))
    await eventually(lambda: seen == ["one", "two", "end"], message="the end record")
    task.set((1, "done"), status="done")  # the report lands after the end record: the task view says so later
    await asyncio.wait_for(following, 10)


async def test_follow_ends_quietly_when_the_attempt_is_over_without_an_end_record(
    nc: NatsClient, subjects: Subjects, stream: str
) -> None:
    task = Task(uuid.uuid4(), (1, "active"))
    tid = task.view.task_id
    await publish(nc, subjects, line(tid, 1, "then the agent was killed"))
    following = asyncio.create_task(texts(reader(nc, subjects, task, attempt=1, follow=True)))
    await asyncio.sleep(0.8)
    assert not following.done()
    task.set((1, "expired"), status="queued")  # its lease expired: the attempt is over
    assert await asyncio.wait_for(following, 10) == ["then the agent was killed"]


async def test_follow_of_a_quiet_attempt_that_is_over_ends_at_once(
    nc: NatsClient, subjects: Subjects, stream: str
) -> None:
    # a short attempt that printed nothing has no records (docs/protocol.md, quiet attempts): nothing to wait for
    task = Task(uuid.uuid4(), (1, "done"), status="done")
    log = LogReader(
        nc.jetstream(), subjects, task.view.task_id, task.probe, quiet_grace_s=60, idle_check_s=60, follow=True
    )
    assert await asyncio.wait_for(texts(log), 10) == [], "not after the minute of quiet grace"


async def test_following_the_latest_goes_on_to_the_next_attempt_and_ends_with_the_task(
    nc: NatsClient, subjects: Subjects, stream: str
) -> None:
    task = Task(uuid.uuid4(), status="queued")
    tid = task.view.task_id
    following = asyncio.create_task(texts(reader(nc, subjects, task, follow=True)))
    await asyncio.sleep(0.3)
    task.set((1, "active"), status="dispatched")
    await publish(nc, subjects, line(tid, 1, "attempt 1"))
    await publish(nc, subjects, end(tid, 2))
    task.set((1, "released"), status="queued")
    await asyncio.sleep(0.3)
    task.set((1, "released"), (2, "active"), status="dispatched")
    await publish(nc, subjects, line(tid, 1, "attempt 2", attempt=2))
    await publish(nc, subjects, end(tid, 2, attempt=2))
    task.set((1, "released"), (2, "done"), status="done")
    assert await asyncio.wait_for(following, 15) == ["attempt 1", "end", "attempt 2", "end"]


async def test_output_stored_before_the_per_host_streams_is_still_read(nc: NatsClient, subjects: Subjects) -> None:
    """An upgrade: the shared `<PU>_LOGS` of earlier versions is retired, its records read until they age out."""
    js = nc.jetstream()
    await js.add_stream(StreamConfig(name=subjects.logs_stream, subjects=[subjects.host_log_all]))
    try:
        before = Task(uuid.uuid4(), (1, "done"), status="done")
        await publish(nc, subjects, line(before.view.task_id, 1, "from the shared stream"))
        await retire_shared_streams(js, subjects)
        async with logs_stream(nc, subjects):  # the host's own stream can now take its subjects
            after = Task(uuid.uuid4(), (1, "done"), status="done")
            await publish(nc, subjects, line(after.view.task_id, 1, "from the host's stream"))
            assert await texts(reader(nc, subjects, before)) == ["from the shared stream"]
            assert await texts(reader(nc, subjects, after)) == ["from the host's stream"]
    finally:
        await js.delete_stream(subjects.logs_stream)
