"""A host whose step output is over its rate share: its records are refused, and the agent marks them once.

A real agent serving in the test's loop, a stand-in scheduler, a real nats-server with the host's logs stream
as the scheduler makes it, and the scheduler's real output rate warden with a small share (20 records a
second over a 1 s window, 2 s cool-down). A step printing stdout and stderr lines in turn makes a record per
line, past the share: the warden closes the stream, the agent gives the refused records up without holding
the step, writes one `refused` record once the stream takes records again, and reports the attempt as it
ran. Output written after the cool-down is stored.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from nats.aio.client import Client

from devsched.agent.config import AgentConfig
from devsched.client.cli.logs import note_of
from devsched.client.logs import LogReader
from devsched.core.outputrate import OutputShare
from devsched.protocol import messages as m
from devsched.protocol.logs import LogKind, LogRecord
from devsched.protocol.subjects import Subjects
from devsched.scheduler.metrics import LOG_CLOSINGS
from devsched.scheduler.warden import OutputWarden
from support.agent_harness import HOST, Running, shell
from support.fake_scheduler import FakeScheduler, Row
from support.log_stream import attempt_status, logs_stream, task_view
from support.polling import eventually

pytestmark = pytest.mark.integration

SHARE = OutputShare(records_per_s=20.0, bytes_per_s=1e9, window_s=1.0, cooldown_s=2.0)


@contextlib.asynccontextmanager
async def warden_running(nc: Client, subjects: Subjects) -> AsyncIterator[OutputWarden]:
    warden = OutputWarden(nc.jetstream(), subjects, SHARE)

    async def run() -> None:
        while True:
            await warden.step()
            await asyncio.sleep(0.1)

    task = asyncio.create_task(run())
    try:
        yield warden
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def records_of(nc: Client, subjects: Subjects, row: Row) -> list[LogRecord]:
    a = row.assignment

    async def probe() -> m.TaskView:
        return task_view(a.task_id, row.host_id, (a.attempt, attempt_status(row.status)))

    async with LogReader(nc.jetstream(), subjects, a.task_id, probe) as reader:
        return [record async for record in reader]


async def test_refused_records_are_given_up_and_marked_once_the_stream_takes_records_again(
    scheduler: FakeScheduler,
    make_config: Callable[..., AgentConfig],
    start_agent: Callable[[AgentConfig], Running],
    nc: Client,
    subjects: Subjects,
    tmp_path: Path,
) -> None:
    closings = LOG_CLOSINGS.labels(HOST)
    closed_before = closings._value.get()
    config = make_config()
    await start_agent(config).ready()
    async with logs_stream(nc, subjects, HOST), warden_running(nc, subjects):
        chatty = "for i in $(seq 1 300); do echo out-$i; echo err-$i >&2; sleep 0.004; done"
        steps = [shell("chatty", chatty), shell("after", "sleep 2.5; echo after the cool-down")]
        row = await scheduler.assign(HOST, config.devices[0].device_id, steps)
        await eventually(lambda: row.reports, timeout=40, message="the attempt is reported")
        report = row.reports[0]
        assert report.outcome.value == "done", "the step's result is kept"
        assert [s.status.value for s in report.result.steps] == ["done", "done"]
        closed = closings._value.get() - closed_before
        assert closed >= 1, "the warden closed the host's logs stream"

        records = await records_of(nc, subjects, row)
    refused = [r for r in records if r.kind is LogKind.REFUSED]
    assert 1 <= len(refused) <= closed, "one refused record for each closing at most"
    marker = refused[0]
    assert marker.refused_records is not None
    assert marker.refused_records >= 1
    assert marker.dropped_bytes is not None
    assert marker.dropped_bytes > 0
    outputs = [r for r in records if r.kind is LogKind.OUTPUT]
    stored = sum(len(r.content()) for r in outputs)
    end = records[-1]
    assert end.kind is LogKind.END, "the end record is stored after the cool-down"
    assert end.output_bytes is not None
    assert stored + sum(r.dropped_bytes or 0 for r in refused) + (end.dropped_bytes or 0) == end.output_bytes, (
        "every byte is stored, refused (and marked) or dropped (and marked)"
    )
    after = [r for r in outputs if r.step == "after"]
    assert [r.content() for r in after] == [b"after the cool-down\n"], "output after the cool-down is stored"
    assert marker.seq < after[0].seq
    note = note_of(marker)
    assert note is not None
    assert "output rate was over its share" in note
    print(
        f"\n{len(records)} records stored, {sum(r.refused_records or 0 for r in refused)} refused in {closed} "
        f"closing(s); marker: {note}"
    )
