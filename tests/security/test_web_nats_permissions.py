"""The web dashboard's NATS user (`web` in deploy/nats/accounts.conf) against a real nats-server with the
committed accounts: it calls the reads and the actions it offers (cancel, resubmit: a submit, drain a
device), follows task events and step output, reads the artifacts bucket, and writes and follows its bucket
of revoked sessions; it cannot drain a host, touch any host subject (`P.host.>`) either way, write or delete
an artifact, or make, change or empty a bucket or stream.

A stand-in scheduler (the `scheduler` user) answers every `P.api.>` request so that an allowed call is seen
to arrive and a refused one is seen not to; the streams and the bucket are created as the scheduler does.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Iterator
from datetime import UTC, datetime
from pathlib import Path

import nats
import nats.errors
import pytest
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg

from devsched.client import Client
from devsched.client.artifacts import open_chunks
from devsched.client.logs import LogReader, collect_output
from devsched.client.watch import stored_events
from devsched.protocol import endpoints
from devsched.protocol import messages as m
from devsched.protocol.artifacts import ArtifactView
from devsched.protocol.codec import encode
from devsched.protocol.logs import LogKind, LogRecord, OutputStream
from devsched.protocol.subjects import MSG_ID_HEADER, Subjects, log_msg_id
from devsched.scheduler.jetstream import ensure_host_streams, ensure_streams
from devsched.scheduler.settings import SchedulerSettings
from devsched.web import revocations
from devsched.web.sessions import Revoked
from support.log_stream import task_view
from support.polling import eventually
from support.scheduler_harness import BUDGETS
from support.secured_nats import SecuredNats, secured_nats

pytestmark = [pytest.mark.security, pytest.mark.integration]

S = Subjects("devsched")
#: How long a refused message would take to show up, at most, on loopback.
WATCH_S = 1.0


@pytest.fixture
def secured(tmp_path: Path) -> Iterator[SecuredNats]:
    with secured_nats(tmp_path / "nats") as server:
        yield server


class Web:
    """The web user's connection, with the permission errors the server sent it."""

    def __init__(self) -> None:
        self.violations: list[str] = []
        self.nc: NatsClient | None = None

    async def connect(self, server: SecuredNats) -> NatsClient:
        async def on_error(exc: Exception) -> None:
            self.violations.append(str(exc).lower())

        self.nc = await nats.connect(server.url("web"), error_cb=on_error, allow_reconnect=False)
        return self.nc


@pytest.fixture
async def scheduler(secured: SecuredNats) -> AsyncIterator[tuple[NatsClient, list[str]]]:
    """The scheduler's user: the streams created, every `P.api.>` request answered and noted."""
    nc = await nats.connect(secured.url("scheduler"))
    settings = SchedulerSettings(subject_prefix="devsched", **BUDGETS)
    await ensure_streams(nc.jetstream(), S, settings)
    await ensure_host_streams(nc.jetstream(), S, settings, "bench-07")  # as its registration does
    heard: list[str] = []

    async def answer(msg: Msg) -> None:
        heard.append(msg.subject)
        if msg.reply:
            await msg.respond(b'{"ok": true}')

    await nc.subscribe("devsched.api.>", cb=answer)
    await nc.flush()
    yield nc, heard
    await nc.close()


@pytest.fixture
async def web(secured: SecuredNats, scheduler: object) -> AsyncIterator[Web]:
    w = Web()
    await w.connect(secured)
    yield w
    if w.nc is not None:
        await w.nc.close()


async def test_the_web_user_calls_the_reads_cancel_resubmit_and_device_drain(
    web: Web, scheduler: tuple[NatsClient, list[str]]
) -> None:
    assert web.nc is not None
    _, heard = scheduler
    allowed = [
        S.endpoint(endpoints.TASKS_GET),
        S.endpoint(endpoints.TASKS_LIST),
        S.endpoint(endpoints.TASKS_CANCEL),
        S.endpoint(endpoints.TASKS_SUBMIT),  # resubmit
        S.endpoint(endpoints.HOSTS_LIST),
        S.endpoint(endpoints.DEVICES_DRAIN),
        S.endpoint(endpoints.TASKS_ARTIFACTS),
    ]
    for subject in allowed:
        reply = await web.nc.request(subject, b"{}", timeout=5)
        assert reply.data == b'{"ok": true}', subject
    assert heard == allowed
    assert web.violations == []


async def test_the_web_user_cannot_drain_a_host_or_touch_a_host_subject(
    web: Web, scheduler: tuple[NatsClient, list[str]]
) -> None:
    assert web.nc is not None
    _, heard = scheduler
    task = uuid.uuid4()
    refused = [
        S.endpoint(endpoints.HOSTS_DRAIN),
        S.endpoint(endpoints.DEVICES_FORGET),  # operators only: free a device from its host
        S.endpoint(endpoints.DEVICES_LABEL),  # operators only: pin labels
        "devsched.api.anything.else",
        "$SRV.PING",
        "devsched.host.bench-07.heartbeat",
        "devsched.host.bench-07.claim",
        S.host_log("bench-07", task, 1),
        S.host_upload("bench-07", task, 1, "u1"),
    ]
    answers = await asyncio.gather(
        *(web.nc.request(subject, b"{}", timeout=WATCH_S) for subject in refused), return_exceptions=True
    )
    assert all(isinstance(a, nats.errors.TimeoutError | nats.errors.NoRespondersError) for a in answers), answers
    await eventually(lambda: len(web.violations) >= len(refused), message="every publish is refused")
    for subject in refused:
        assert any("publish" in v and subject.lower() in v for v in web.violations), (subject, web.violations)
    assert heard == [], "nothing refused reaches the scheduler"

    # nor may it listen to any host subject (claims, heartbeats, log records, uploads)
    before = len(web.violations)
    for subject in ("devsched.host.>", S.host_log_all, S.host_upload_all, "devsched.host.bench-07.*"):
        await web.nc.subscribe(subject)
    await web.nc.flush()
    await eventually(lambda: len(web.violations) >= before + 4, message="every subscription is refused")
    subscribe = [v for v in web.violations[before:] if "subscription" in v]
    assert len(subscribe) == 4, web.violations[before:]


async def test_the_web_user_follows_task_events_and_step_output(
    secured: SecuredNats, web: Web, scheduler: tuple[NatsClient, list[str]]
) -> None:
    sched, _ = scheduler
    task = uuid.uuid4()
    event = m.TaskEvent(event="submitted", task_id=task, seq=1, status="queued", at=datetime.now(UTC))
    await sched.jetstream().publish(S.task_events(task), encode(event))
    host = await nats.connect(secured.url("bench-07"), inbox_prefix="_INBOX.bench-07")
    try:
        record = LogRecord(
            task_id=task, attempt=1, seq=1, kind=LogKind.OUTPUT, at=datetime.now(UTC), offset=0, step="s", index=0,
            stream=OutputStream.STDOUT, encoding="utf-8", data="from bench-07\n",
        )  # fmt: skip
        await host.jetstream().publish(
            S.host_log("bench-07", task, 1), encode(record), headers={MSG_ID_HEADER: log_msg_id(uuid.uuid4(), 1)}
        )
    finally:
        await host.close()
    async with Client.connect(secured.url("web"), prefix="devsched", timeout=5) as client:
        assert [e.event for e in await stored_events(client, task)] == ["submitted"]

        async def probe() -> m.TaskView:
            return task_view(task, "bench-07", (1, "done"), status="done")

        reader = LogReader(client.nc.jetstream(), S, task, probe)
        assert await collect_output(reader) == b"from bench-07\n"
    assert web.violations == []


async def test_the_web_user_reads_the_artifacts_bucket_and_never_writes_it(
    secured: SecuredNats, web: Web, scheduler: tuple[NatsClient, list[str]]
) -> None:
    assert web.nc is not None
    sched, _ = scheduler
    task = uuid.uuid4()
    data = bytes(range(256)) * 1200  # several object chunks
    bucket = S.artifacts_bucket
    obj = f"{task}/1/u1"
    await (await sched.jetstream().object_store(bucket)).put(obj, data)
    artifact = ArtifactView(
        attempt=1, name="out/data.bin", step="s", size=len(data), sha256=hashlib.sha256(data).hexdigest(),
        host_id="bench-07", stored_at=datetime.now(UTC), object=obj,
    )  # fmt: skip
    async with Client.connect(secured.url("web"), prefix="devsched", timeout=5) as client:
        chunks = [chunk async for chunk in await open_chunks(client, bucket, artifact)]
    assert b"".join(chunks) == data
    assert len(chunks) > 1

    store = await web.nc.jetstream(timeout=WATCH_S).object_store(bucket)  # a refused write is a timeout
    before = len(web.violations)
    with pytest.raises(Exception):  # noqa: B017, PT011 - refused: a timeout or a permissions error, whichever comes first
        await store.put(
            f"{task}/1/forged",
            b"forged",
        )
    with pytest.raises(Exception):  # noqa: B017, PT011
        await store.delete(obj)
    await eventually(lambda: len(web.violations) > before, message="the writes are refused")
    assert all("publish" in v for v in web.violations[before:]), web.violations[before:]
    sched_store = await sched.jetstream().object_store(bucket)
    assert (await sched_store.get_info(obj)).size == len(data)  # still there, whole
    with pytest.raises(nats.js.errors.ObjectNotFoundError):
        await sched_store.get_info(f"{task}/1/forged")


async def test_the_web_user_reads_only_log_subjects_of_the_per_host_streams(
    web: Web, scheduler: tuple[NatsClient, list[str]]
) -> None:
    """Its consumer permission names the log filter, not a stream: nothing but log subjects can be read."""
    assert web.nc is not None
    task = uuid.uuid4()
    upload = S.host_upload("bench-07", task, 1, "u1")
    uploads, logs = S.host_uploads_stream("bench-07"), S.host_logs_stream("bench-07")

    def create(stream: str, filter_subject: str) -> bytes:
        config = {"name": "w1", "filter_subject": filter_subject, "deliver_subject": "_INBOX.w1", "ack_policy": "none"}
        return json.dumps({"stream_name": stream, "config": config}).encode()

    refused = [  # by the permissions: not a log filter, or no filter named in the subject
        (f"$JS.API.CONSUMER.CREATE.{uploads}", create(uploads, upload)),
        (f"$JS.API.CONSUMER.CREATE.{uploads}.w1.{upload}", create(uploads, upload)),
        (f"$JS.API.CONSUMER.CREATE.{logs}", create(logs, S.host_logs("bench-07"))),
        (f"$JS.API.STREAM.INFO.{logs}", b""),
        (f"$JS.API.STREAM.PURGE.{logs}", b""),
    ]
    answers = await asyncio.gather(
        *(web.nc.request(subject, body, timeout=WATCH_S) for subject, body in refused), return_exceptions=True
    )
    assert all(isinstance(a, nats.errors.TimeoutError | nats.errors.NoRespondersError) for a in answers), answers
    await eventually(lambda: len(web.violations) >= len(refused), message="every request is refused")
    # a log filter in the subject and another filter in the request: the server holds it to the subject's
    log_filter = S.host_log("bench-07", task, 1)
    reply = await web.nc.request(
        f"$JS.API.CONSUMER.CREATE.{uploads}.w1.{log_filter}", create(uploads, upload), timeout=5
    )
    assert json.loads(reply.data)["error"]["err_code"] == 10131, reply.data


async def test_the_web_user_writes_and_follows_its_revoked_sessions_and_touches_no_other_stream(
    web: Web, scheduler: tuple[NatsClient, list[str]]
) -> None:
    """Logouts shared by the replicas: the web user puts a session id into `<PU>_WEB_REVOKED` (made by the
    scheduler) and follows the bucket, through the dashboard's own code; it can neither make, change, purge
    nor delete the bucket, nor write anything else. An entry lives as long as its cookie, then NATS drops it."""
    assert web.nc is not None
    sched, _ = scheduler
    bucket = S.web_revoked_bucket
    stream = f"KV_{bucket}"
    shared = revocations.Revocations(web.nc, bucket, publish_timeout_s=5)
    following = await revocations.start(shared)
    try:
        assert await shared.loaded(5), shared.problem()
        assert shared.problem() is None
        now = time.time()
        await shared.publish(Revoked("a-logged-out-session", int(now) + 3600), now)
        await eventually(lambda: "a-logged-out-session" in shared.ids, message="the watch sees the logout")
        # an entry ends with its cookie: this one's cookie had a second left
        await shared.publish(Revoked("a-short-session-0", int(now) + 1), now)
        reader = await web.nc.jetstream().subscribe(f"$KV.{bucket}.a-short-session-0", ordered_consumer=True)
        short = await reader.next_msg(timeout=5)
        await reader.unsubscribe()
        assert short.headers is not None
        assert short.headers["Nats-TTL"] == "2"

        async def entries() -> int:
            return (await sched.jetstream().stream_info(stream)).state.messages

        await eventually(lambda: _is(entries(), 1), timeout=10, message="NATS drops the entry once its cookie expired")
        assert web.violations == []

        # the bucket is append-only for the web user (its configuration, not only the permissions)
        with pytest.raises(nats.js.errors.APIError, match="rollup not permitted"):
            await web.nc.jetstream().publish(f"$KV.{bucket}.x", b"", headers={"Nats-Rollup": "all"})
        config = json.dumps({"name": stream, "subjects": ["devsched.>"]}).encode()
        refused = [
            (f"$JS.API.STREAM.CREATE.{stream}", config),
            (f"$JS.API.STREAM.UPDATE.{stream}", config),
            (f"$JS.API.STREAM.DELETE.{stream}", b""),
            (f"$JS.API.STREAM.PURGE.{stream}", b""),
            (f"$JS.API.STREAM.MSG.DELETE.{stream}", b'{"seq": 1}'),
            (f"$JS.API.CONSUMER.DURABLE.CREATE.{stream}.keep", b"{}"),
            ("$JS.API.STREAM.CREATE.ANOTHER_BUCKET", config),
            ("$KV.ANOTHER_BUCKET.x", b"1"),  # no other bucket
            (S.task_events(uuid.uuid4()), b"{}"),  # nor another stream's subjects
            (S.assign("bench-07"), b"{}"),
        ]
        answers = await asyncio.gather(
            *(web.nc.request(subject, body, timeout=WATCH_S) for subject, body in refused), return_exceptions=True
        )
        assert all(isinstance(a, (nats.errors.TimeoutError, nats.errors.NoRespondersError)) for a in answers), answers
        await eventually(lambda: len(web.violations) >= len(refused), message="every request is refused")
        for subject, _ in refused:
            assert any("publish" in v and subject.lower() in v for v in web.violations), (subject, web.violations)
        info = await sched.jetstream().stream_info(stream)
        assert info.config.subjects == [f"$KV.{bucket}.>"]
        assert info.state.messages == 1, "the revocation is still there, alone"
        assert "a-logged-out-session" in shared.ids
    finally:
        await revocations.stop(following)


async def _is(value: Awaitable[int], expected: int) -> bool:
    return await value == expected


async def test_a_dashboard_started_before_the_bucket_exists_fails_closed_until_the_scheduler_makes_it(
    secured: SecuredNats,
) -> None:
    """A web replica may start before the scheduler: no session is live and no logout is taken (503) until the
    scheduler has made the bucket; then the replica loads it within a bounded poll, with no permission refused."""
    web = Web()
    nc = await web.connect(secured)
    shared = revocations.Revocations(nc, S.web_revoked_bucket, publish_timeout_s=2)
    following = asyncio.create_task(shared.follow())  # as `revocations.start`, without its wait for a first load
    sched = await nats.connect(secured.url("scheduler"))
    try:
        assert not await shared.loaded(0.5)
        await eventually(lambda: "no bucket" in (shared.problem() or ""), message="the replica says why")
        assert not shared.ids.complete
        with pytest.raises(revocations.NotRecorded):
            await shared.publish(Revoked("too-early-session", int(time.time()) + 60), time.time())
        await ensure_streams(sched.jetstream(), S, SchedulerSettings(subject_prefix="devsched", **BUDGETS))
        await eventually(lambda: shared.problem() is None, timeout=10, message="the replica loads the new bucket")
        assert shared.ids.complete
        assert web.violations == []
    finally:
        await revocations.stop(following)
        await sched.close()
        await nc.close()
