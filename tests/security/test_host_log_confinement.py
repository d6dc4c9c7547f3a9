"""Step output under the deploy permissions: a host writes logs only for its own subjects (with the stream's
acknowledgement), reads none (not even its own), and cannot write into another host's; operators read them.

Proven against a real nats-server with the committed accounts (deploy/nats/accounts.conf, host_user.py);
the logs stream is created by the scheduler's own user, as the scheduler does at start.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from pathlib import Path

import nats
import nats.errors
import nats.js.errors
import pytest

from devsched.client.logs import LogReader, collect_output
from devsched.core.outputrate import OutputShare
from devsched.protocol import messages as m
from devsched.protocol.codec import encode
from devsched.protocol.logs import LogKind, LogRecord, OutputStream
from devsched.protocol.subjects import MSG_ID_HEADER, Subjects, log_msg_id
from devsched.scheduler.jetstream import ensure_host_streams, ensure_streams
from devsched.scheduler.settings import SchedulerSettings
from devsched.scheduler.warden import OutputWarden
from support.log_stream import task_view
from support.polling import eventually
from support.scheduler_harness import BUDGETS
from support.secured_nats import HostConnection as Host
from support.secured_nats import SecuredNats, secured_nats

pytestmark = [pytest.mark.security, pytest.mark.integration]

SUBJECTS = Subjects("devsched")
#: How long a refused or stray message would take to show up, at most, on loopback.
WATCH_S = 1.0


@pytest.fixture
def secured(tmp_path: Path) -> Iterator[SecuredNats]:
    with secured_nats(tmp_path / "nats") as server:
        yield server


@pytest.fixture
async def hosts(secured: SecuredNats) -> AsyncIterator[tuple[Host, Host]]:
    scheduler = await nats.connect(secured.url("scheduler"))
    try:
        settings = SchedulerSettings(subject_prefix="devsched", **BUDGETS)
        await ensure_streams(scheduler.jetstream(), SUBJECTS, settings)
        for host_id in ("bench-07", "bench-08"):  # as their registrations do
            await ensure_host_streams(scheduler.jetstream(), SUBJECTS, settings, host_id)
    finally:
        await scheduler.close()
    owner, neighbour = Host("bench-07"), Host("bench-08")
    await owner.connect(secured)
    await neighbour.connect(secured)
    yield owner, neighbour
    for host in (owner, neighbour):
        if host.nc is not None:
            await host.nc.close()


def record(task_id: uuid.UUID, seq: int, text: str) -> bytes:
    return encode(
        LogRecord(
            task_id=task_id,
            attempt=1,
            seq=seq,
            kind=LogKind.OUTPUT,
            at=datetime.now(UTC),
            offset=0,
            step="s",
            index=0,
            stream=OutputStream.STDOUT,
            encoding="utf-8",
            data=text,
        )
    )


async def stored(secured: SecuredNats, subject: str) -> int:
    """How many messages bench-07's logs stream holds on `subject` (as the scheduler sees it)."""
    scheduler = await nats.connect(secured.url("scheduler"))
    try:
        info = await scheduler.jetstream().stream_info(SUBJECTS.host_logs_stream("bench-07"), subjects_filter=subject)
    finally:
        await scheduler.close()
    return (info.state.subjects or {}).get(subject, 0)


async def test_a_host_writes_its_own_logs_and_an_operator_reads_them(
    secured: SecuredNats, hosts: tuple[Host, Host]
) -> None:
    owner, _ = hosts
    assert owner.nc is not None
    task = uuid.uuid4()
    subject = SUBJECTS.host_log("bench-07", task, 1)
    ack = await owner.nc.jetstream().publish(
        subject, record(task, 1, "from bench-07\n"), headers={MSG_ID_HEADER: log_msg_id(uuid.uuid4(), 1)}
    )
    assert (ack.stream, ack.seq) == (SUBJECTS.host_logs_stream("bench-07"), 1), "the acknowledgement reaches the host"
    assert owner.violations == []

    operator = await nats.connect(secured.url("operator"))
    try:

        async def probe() -> m.TaskView:
            return task_view(task, "bench-07", (1, "done"), status="done")

        reader = LogReader(operator.jetstream(), SUBJECTS, task, probe)
        assert await collect_output(reader) == b"from bench-07\n"
    finally:
        await operator.close()


async def test_a_host_cannot_write_into_another_hosts_logs(secured: SecuredNats, hosts: tuple[Host, Host]) -> None:
    owner, neighbour = hosts
    assert neighbour.nc is not None
    task = uuid.uuid4()
    victim = SUBJECTS.host_log("bench-07", task, 1)
    with pytest.raises(nats.errors.TimeoutError):  # no acknowledgement: the server drops it
        await neighbour.nc.jetstream().publish(victim, record(task, 1, "injected\n"), timeout=WATCH_S)
    await eventually(lambda: neighbour.violations, message="the server refuses the publish")
    assert any("publish" in v and victim in v for v in neighbour.violations), neighbour.violations
    assert await stored(secured, victim) == 0
    assert await stored(secured, SUBJECTS.host_logs("bench-07")) == 0
    assert owner.violations == []


@pytest.mark.parametrize("who", ["bench-08", "bench-07"])
async def test_a_host_reads_no_logs_not_even_its_own(secured: SecuredNats, hosts: tuple[Host, Host], who: str) -> None:
    owner, neighbour = hosts
    assert owner.nc is not None
    task = uuid.uuid4()
    subject = SUBJECTS.host_log("bench-07", task, 1)
    await owner.nc.jetstream().publish(subject, record(task, 1, "secret output\n"))
    reader = owner if who == "bench-07" else neighbour
    assert reader.nc is not None
    nc = reader.nc
    before = len(reader.violations)
    # the subjects themselves: a subscription is refused, nothing is heard
    heard: list[bytes] = []

    async def hear(msg: nats.aio.msg.Msg) -> None:
        heard.append(msg.data)

    await nc.subscribe(SUBJECTS.host_log_all, cb=hear)
    await nc.subscribe(SUBJECTS.host_logs("bench-07"), cb=hear)
    await nc.flush()
    # the stream through the JetStream API, directly or mapped the way the host's consumer is
    own = SUBJECTS.host_logs_stream("bench-07")
    calls = [
        call
        for api in ("$JS.API", SUBJECTS.host_jetstream_api)
        for call in (
            f"{api}.STREAM.INFO.{own}",
            f"{api}.CONSUMER.CREATE.{own}",
            f"{api}.CONSUMER.CREATE.{own}.reader.{subject}",
            f"{api}.STREAM.MSG.GET.{own}",
            f"{api}.DIRECT.GET.{own}.{subject}",
        )
    ]

    async def answer(call: str) -> bytes | None:
        try:
            return (await nc.request(call, b'{"last_by_subj": "' + subject.encode() + b'"}', timeout=WATCH_S)).data
        except (nats.errors.TimeoutError, nats.errors.NoRespondersError):
            return None  # refused, or nothing there

    for call, data in zip(calls, await asyncio.gather(*(answer(c) for c in calls)), strict=True):
        if data is not None:  # the host's own account answers `$JS.API` itself: JetStream is not enabled there
            assert b"secret output" not in data, call
            assert b'"error"' in data, (call, data)
    await owner.nc.jetstream().publish(subject, record(task, 2, "more secret output\n"))
    await eventually(lambda: len(reader.violations) >= before + 2, message="the subscriptions are refused")
    subscribe = [v for v in reader.violations if "subscription" in v]
    assert any(SUBJECTS.host_log_all.lower() in v for v in subscribe), reader.violations
    assert heard == [], "no host hears any step output"


async def test_a_host_past_its_output_rate_share_is_refused_through_its_own_account(
    secured: SecuredNats, hosts: tuple[Host, Host]
) -> None:
    """The output rate warden with the scheduler's deploy user: it reads every host's logs stream state in one
    request and closes the loud host's stream; that host's publishes through its account are refused (503), the
    other host's are stored, and the stream opens after the cool-down."""
    owner, neighbour = hosts
    assert owner.nc is not None
    assert neighbour.nc is not None
    share = OutputShare(records_per_s=5.0, bytes_per_s=1e6, window_s=2.0, cooldown_s=2.0)
    now = [1_000_000.0]
    scheduler = await nats.connect(secured.url("scheduler"))
    try:
        warden = OutputWarden(scheduler.jetstream(), SUBJECTS, share, clock=lambda: now[0], monotonic=lambda: now[0])
        task = uuid.uuid4()

        async def publish(host: Host, seq: int) -> bool:
            assert host.nc is not None
            subject = SUBJECTS.host_log(host.host_id, task, 1)
            try:
                await host.nc.jetstream().publish(subject, record(task, seq, "x\n"), timeout=WATCH_S)
            except nats.js.errors.APIError as exc:
                assert exc.err_code == 10077, exc  # noqa: PT017 - the refusal's code is the point
                return False
            return True

        await warden.step()
        assert all([await publish(owner, seq) for seq in range(1, 12)]), "11 records, past 10 in a 2 s window"
        now[0] += 1.0
        await warden.step()
        assert set(warden.closed) == {"bench-07"}
        assert not await publish(owner, 12), "refused through its own account"
        assert await publish(neighbour, 1), "the other host's record is stored"
        now[0] += share.cooldown_s
        await warden.step()
        assert warden.closed == {}
        assert await publish(owner, 13)
        assert owner.violations == neighbour.violations == []
    finally:
        await scheduler.close()
