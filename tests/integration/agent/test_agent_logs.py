"""The agent streams step output into `<PU>_LOGS`, and a slow or absent NATS never holds a step up.

A real agent serving in the test's loop, a stand-in scheduler and a real nats-server with the logs stream
as the scheduler creates it; the output is read back with the client's `LogReader`.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from nats.aio.client import Client

from devsched.agent.config import AgentConfig
from devsched.client.logs import LogReader
from devsched.protocol import messages as m
from devsched.protocol.logs import LogKind, LogRecord, OutputStream
from devsched.protocol.subjects import Subjects
from support.agent_harness import HOST, Running, shell
from support.fake_scheduler import FakeScheduler, Row
from support.log_stream import attempt_status, logs_stream, task_view
from support.polling import eventually
from support.tcp_proxy import TcpProxy

pytestmark = pytest.mark.integration


@pytest.fixture
async def stream(nc: Client, subjects: Subjects) -> AsyncIterator[str]:
    async with logs_stream(nc, subjects, HOST) as name:
        yield name


async def records_of(nc: Client, subjects: Subjects, row: Row, **options: object) -> list[LogRecord]:
    """Every record of the row's attempt, read as a client reads them."""
    a = row.assignment

    async def probe() -> m.TaskView:
        return task_view(a.task_id, row.host_id, (a.attempt, attempt_status(row.status)))

    reader = LogReader(nc.jetstream(), subjects, a.task_id, probe, **options)  # type: ignore[arg-type]
    async with reader:
        return [record async for record in reader]


def output(records: list[LogRecord], stream: OutputStream | None = None, step: str | None = None) -> bytes:
    return b"".join(
        r.content()
        for r in records
        if r.kind is LogKind.OUTPUT and stream in (None, r.stream) and step in (None, r.step)
    )


async def reported(row: Row, within: float = 30.0) -> m.ReportRequest:
    await eventually(lambda: row.reports or row.releases, timeout=within, message="the attempt ended")
    assert row.reports, row.releases
    return row.reports[0]


async def test_every_byte_of_stdout_and_stderr_is_stored_in_order(
    scheduler: FakeScheduler,
    make_config: Callable[..., AgentConfig],
    start_agent: Callable[[AgentConfig], Running],
    nc: Client,
    subjects: Subjects,
    stream: str,
    tmp_path: Path,
) -> None:
    config = make_config()
    await start_agent(config).ready()
    blob = tmp_path / "blob"
    steps = [
        shell("hello", "echo out-1; echo err-1 >&2; sleep 0.2; echo out-2; sleep 0.2; printf 'err-2' >&2"),
        shell("binary", f"head -c 3000000 /dev/urandom > {blob}; cat {blob}; exit 3"),
        shell("skipped", "echo never"),
    ]
    row = await scheduler.assign(HOST, config.devices[0].device_id, steps)
    report = await reported(row)
    assert report.outcome.value == "failed"
    records = await records_of(nc, subjects, row)

    assert [r.seq for r in records] == list(range(1, len(records) + 1))
    assert output(records, OutputStream.STDOUT, "hello") == b"out-1\nout-2\n"
    assert output(records, OutputStream.STDERR, "hello") == b"err-1\nerr-2"
    hello = [(r.stream, r.content()) for r in records if r.step == "hello" and r.kind is LogKind.OUTPUT]
    assert [part for _, part in hello] == [b"out-1\n", b"err-1\n", b"out-2\n", b"err-2"], "in the order printed"
    assert output(records, OutputStream.STDOUT, "binary") == blob.read_bytes()
    ends = [(r.step, r.status, r.exit_code) for r in records if r.kind is LogKind.STEP_END]
    assert ends == [("hello", "done", 0), ("binary", "failed", 3)], "a skipped step has no output and no end"
    end = records[-1]
    assert end.kind is LogKind.END
    assert (end.outcome, end.lease_lost, end.released, end.dropped_bytes) == ("failed", False, False, 0)
    assert end.output_bytes == end.sent_bytes == len(output(records))
    offsets = [r.offset for r in records if r.kind is LogKind.OUTPUT]
    sizes = [len(r.content()) for r in records if r.kind is LogKind.OUTPUT]
    assert offsets == [sum(sizes[:i]) for i in range(len(sizes))], "no gap, no overlap"
    # the report's tail is still the summary
    assert report.result.steps[1].output_tail is not None
    assert len(report.result.steps[1].output_tail.encode("utf-8", "surrogateescape")) > 0

    only = await records_of(nc, subjects, row, step="hello")
    assert {r.step for r in only} == {"hello", None}
    assert only[-1].kind is LogKind.END


async def test_a_nats_that_does_not_answer_never_holds_a_step_up_and_drops_are_reported(
    scheduler: FakeScheduler,
    make_config: Callable[..., AgentConfig],
    start_agent: Callable[[AgentConfig], Running],
    nc: Client,
    subjects: Subjects,
    stream: str,
    nats_url: str,
    tmp_path: Path,
) -> None:
    host, port = nats_url.removeprefix("nats://").rsplit(":", 1)
    async with TcpProxy((host, int(port))) as proxy:
        config = make_config(nats_url=proxy.url(), log_buffer_bytes=256 * 1024)
        await start_agent(config).ready()
        started, gate, printed = tmp_path / "started", tmp_path / "gate", tmp_path / "printed"
        later = tmp_path / "later"
        steps = [
            shell("wait", f"echo waiting; touch {started}; while [ ! -e {gate} ]; do sleep 0.02; done"),
            shell("flood", f"head -c 2000000 /dev/zero | tr '\\0' y; touch {printed}"),
            shell("after", f"while [ ! -e {later} ]; do sleep 0.02; done; echo after"),
        ]
        row = await scheduler.assign(HOST, config.devices[0].device_id, steps)
        await eventually(started.exists, timeout=20, message="first step started")

        async def streaming() -> bool:
            return output(await records_of(nc, subjects, row)) == b"waiting\n"

        await eventually(streaming, timeout=10, message="the first line stored while the step runs")
        proxy.blackhole()
        t0 = time.monotonic()
        gate.touch()
        await eventually(printed.exists, timeout=10, message="the flood step printed everything while NATS was away")
        took = time.monotonic() - t0
        proxy.heal()

        async def flood_stored() -> bool:
            records = await records_of(nc, subjects, row)
            return any(r.kind is LogKind.STEP_END and r.step == "flood" for r in records)

        await eventually(flood_stored, timeout=30, message="what was kept of the flood is stored once NATS is back")
        later.touch()
        report = await reported(row, within=60)
    assert report.outcome.value == "done"
    assert took < 10
    records = await records_of(nc, subjects, row)
    dropped = [r for r in records if r.kind is LogKind.DROPPED]
    assert dropped, [r.kind for r in records]
    assert all(r.step == "flood" for r in dropped)
    end = records[-1]
    assert end.kind is LogKind.END
    assert end.dropped_bytes == sum(r.dropped_bytes or 0 for r in dropped) > 0
    assert end.output_bytes == len(b"waiting\n") + 2_000_000 + len(b"after\n")
    assert end.sent_bytes == len(output(records))
    assert end.sent_bytes + end.dropped_bytes == end.output_bytes
    assert output(records, step="after") == b"after\n", "output after the outage is stored again"
    for record in records:  # what was kept is where it belongs
        if record.kind is LogKind.OUTPUT and record.step == "flood":
            assert set(record.content()) == {ord("y")}


async def test_the_output_of_an_attempt_that_lost_its_lease_is_kept_and_marked(
    scheduler: FakeScheduler,
    make_config: Callable[..., AgentConfig],
    start_agent: Callable[[AgentConfig], Running],
    nc: Client,
    subjects: Subjects,
    stream: str,
    tmp_path: Path,
) -> None:
    config = make_config()
    await start_agent(config).ready()
    gate = tmp_path / "gate"
    steps = [
        shell("first", f"echo before the loss; while [ ! -e {gate} ]; do sleep 0.02; done; echo still mine?"),
        shell("second", "echo never runs"),
    ]
    row = await scheduler.assign(HOST, config.devices[0].device_id, steps)

    async def printed() -> bool:
        return b"before the loss" in output(await records_of(nc, subjects, row))

    await eventually(printed, timeout=20, message="the first line is readable while the step runs")
    scheduler.reject_renewals = True
    gate.touch()

    async def ended() -> list[LogRecord] | None:
        records = await records_of(nc, subjects, row)
        return records if records and records[-1].kind is LogKind.END else None

    records = await eventually(ended, timeout=30, message="the attempt's end record")
    end = records[-1]
    assert (end.lease_lost, end.outcome) == (True, "failed")
    assert output(records) == b"before the loss\nstill mine?\n"
    assert [r.step for r in records if r.kind is LogKind.STEP_END] == ["first"]


async def test_without_a_logs_stream_steps_run_and_reports_go_promptly(
    scheduler: FakeScheduler,
    make_config: Callable[..., AgentConfig],
    start_agent: Callable[[AgentConfig], Running],
) -> None:
    config = make_config(log_flush_s=30)
    await start_agent(config).ready()
    t0 = time.monotonic()
    row = await scheduler.assign(HOST, config.devices[0].device_id, [shell("s", "echo no stream to take this")])
    report = await reported(row)
    assert report.outcome.value == "done"
    assert report.result.steps[0].output_tail == "no stream to take this\n"
    # the end waits for the records only while they make progress (stall_s: one request timeout)
    assert time.monotonic() - t0 < 10
    t1 = time.monotonic()
    later = await scheduler.assign(HOST, config.devices[0].device_id, [shell("s", "echo again")])
    await reported(later)
    assert time.monotonic() - t1 < 5, "a host whose publishing fails does not wait at every end"


async def test_streaming_can_be_switched_off(
    scheduler: FakeScheduler,
    make_config: Callable[..., AgentConfig],
    start_agent: Callable[[AgentConfig], Running],
    nc: Client,
    subjects: Subjects,
    stream: str,
) -> None:
    config = make_config(log_streaming=False)
    await start_agent(config).ready()
    row = await scheduler.assign(HOST, config.devices[0].device_id, [shell("s", "echo tail only")])
    report = await reported(row)
    assert report.result.steps[0].output_tail == "tail only\n"
    assert await records_of(nc, subjects, row) == []
    info = await nc.jetstream().stream_info(stream)
    assert info.state.messages == 0


async def test_an_attempt_that_prints_nothing_and_ends_at_once_sends_no_record(
    scheduler: FakeScheduler,
    make_config: Callable[..., AgentConfig],
    start_agent: Callable[[AgentConfig], Running],
    nc: Client,
    subjects: Subjects,
    stream: str,
) -> None:
    config = make_config()
    await start_agent(config).ready()
    quiet = await scheduler.assign(HOST, config.devices[0].device_id, [shell("a", "true"), shell("b", "exit 4")])
    report = await reported(quiet)
    assert [(s.name, s.status) for s in report.result.steps] == [("a", "done"), ("b", "failed")]
    # a later attempt that prints is stored: the quiet one's records would have been stored before it
    loud = await scheduler.assign(HOST, config.devices[0].device_id, [shell("c", "echo loud")])
    await reported(loud)
    assert output(await records_of(nc, subjects, loud)) == b"loud\n"
    assert await records_of(nc, subjects, quiet) == [], "its steps' ends are in its report"
    info = await nc.jetstream().stream_info(stream, subjects_filter=subjects.host_log_all)
    assert set(info.state.subjects or {}) == {subjects.host_log(HOST, loud.assignment.task_id, 1)}


async def test_a_quiet_step_is_held_back_only_until_output_or_its_second_passes(
    scheduler: FakeScheduler,
    make_config: Callable[..., AgentConfig],
    start_agent: Callable[[AgentConfig], Running],
    nc: Client,
    subjects: Subjects,
    stream: str,
    tmp_path: Path,
) -> None:
    config = make_config()
    await start_agent(config).ready()
    gate = tmp_path / "gate"
    steps = [shell("quiet", "true"), shell("wait", f"while [ ! -e {gate} ]; do sleep 0.02; done")]
    row = await scheduler.assign(HOST, config.devices[0].device_id, steps)

    async def quiet_ended() -> list[LogRecord] | None:
        records = await records_of(nc, subjects, row)
        return records or None

    records = await eventually(quiet_ended, timeout=20, message="the quiet step's end, once its second passed")
    assert [(r.kind, r.step, r.status) for r in records] == [(LogKind.STEP_END, "quiet", "done")]
    gate.touch()
    await reported(row)
    records = await records_of(nc, subjects, row)
    assert [(r.kind, r.step) for r in records] == [
        (LogKind.STEP_END, "quiet"), (LogKind.STEP_END, "wait"), (LogKind.END, None)
    ]  # fmt: skip
    printed = await scheduler.assign(HOST, config.devices[0].device_id, [shell("q", "true"), shell("p", "echo hi")])
    await reported(printed)
    records = await records_of(nc, subjects, printed)
    assert [(r.kind, r.step) for r in records] == [
        (LogKind.STEP_END, "q"), (LogKind.OUTPUT, "p"), (LogKind.STEP_END, "p"), (LogKind.END, None)
    ], "output sends what was held back, in order"  # fmt: skip


def test_task_ids_in_records_are_uuids() -> None:
    # the subject a reader builds and the one the agent publishes on agree
    subjects = Subjects("p")
    task = uuid.uuid4()
    assert subjects.host_log("h1", str(task).upper(), 2) == f"p.host.h1.log.{task}.2"
