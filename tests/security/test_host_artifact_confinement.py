"""Artifacts under the deploy permissions (issue 12): a host publishes chunks only on its own upload subjects
and commits only in its own name; no host reaches the uploads stream or the artifacts bucket, which only the
scheduler writes and operators read.

Proven against a real nats-server with the committed accounts (deploy/nats/accounts.conf, host_user.py);
the streams and the bucket are created by the scheduler's own user, as the scheduler does at start.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import nats
import nats.errors
import pytest

from devsched.protocol.artifacts import CHUNK_HEADER
from devsched.protocol.subjects import HostVerb, Subjects
from devsched.scheduler.artifacts import object_stream
from devsched.scheduler.jetstream import ensure_host_streams, ensure_streams
from devsched.scheduler.settings import SchedulerSettings
from support.polling import eventually
from support.scheduler_harness import BUDGETS
from support.secured_nats import HostConnection as Host
from support.secured_nats import SecuredNats, secured_nats

pytestmark = [pytest.mark.security, pytest.mark.integration]

SUBJECTS = Subjects("devsched")
BUCKET = SUBJECTS.artifacts_bucket
#: How long a refused message would take to show up, at most, on loopback.
WATCH_S = 1.0
SECRET = b"secret artifact bytes"


@pytest.fixture
def secured(tmp_path: Path) -> Iterator[SecuredNats]:
    with secured_nats(tmp_path / "nats") as server:
        yield server


@pytest.fixture
async def stored(secured: SecuredNats) -> str:
    """The streams and bucket made by the scheduler's user, and one object in the bucket; its name."""
    scheduler = await nats.connect(secured.url("scheduler"))
    try:
        js = scheduler.jetstream()
        settings = SchedulerSettings(subject_prefix="devsched", **BUDGETS)
        await ensure_streams(js, SUBJECTS, settings)
        for host_id in ("bench-07", "bench-08"):  # as their registrations do
            await ensure_host_streams(js, SUBJECTS, settings, host_id)
        name = f"{uuid.uuid4()}/1/upload"
        await (await js.object_store(BUCKET)).put(name, SECRET)
    finally:
        await scheduler.close()
    return name


@pytest.fixture
async def hosts(secured: SecuredNats, stored: str) -> AsyncIterator[tuple[Host, Host]]:
    owner, neighbour = Host("bench-07"), Host("bench-08")
    await owner.connect(secured)
    await neighbour.connect(secured)
    yield owner, neighbour
    for host in (owner, neighbour):
        if host.nc is not None:
            await host.nc.close()


async def uploaded(secured: SecuredNats, subject: str) -> int:
    scheduler = await nats.connect(secured.url("scheduler"))
    try:
        stream = SUBJECTS.host_uploads_stream("bench-07")
        info = await scheduler.jetstream().stream_info(stream, subjects_filter=subject)
        return (info.state.subjects or {}).get(subject, 0)
    finally:
        await scheduler.close()


async def test_an_operator_reads_the_bucket(secured: SecuredNats, stored: str) -> None:
    operator = await nats.connect(secured.url("operator"))
    try:
        assert (await (await operator.jetstream().object_store(BUCKET)).get(stored)).data == SECRET
    finally:
        await operator.close()


async def test_a_host_uploads_on_its_own_subject_only(secured: SecuredNats, hosts: tuple[Host, Host]) -> None:
    owner, neighbour = hosts
    assert owner.nc is not None
    assert neighbour.nc is not None
    task = uuid.uuid4()
    own = SUBJECTS.host_upload("bench-07", task, 1, "u1")
    ack = await owner.nc.jetstream().publish(own, b"chunk", headers={CHUNK_HEADER: "0"})
    assert ack.stream == SUBJECTS.host_uploads_stream("bench-07"), "the stream's acknowledgement reaches the host"
    assert owner.violations == []

    victim = SUBJECTS.host_upload("bench-07", task, 1, "u2")
    with pytest.raises(nats.errors.TimeoutError):  # no acknowledgement: the server drops it
        await neighbour.nc.jetstream().publish(victim, b"injected", headers={CHUNK_HEADER: "0"}, timeout=WATCH_S)
    await eventually(lambda: neighbour.violations, message="the server refuses the publish")
    assert any("publish" in v and victim.lower() in v for v in neighbour.violations), neighbour.violations
    assert await uploaded(secured, victim) == 0
    assert await uploaded(secured, own) == 1


async def test_a_host_cannot_commit_in_another_hosts_name(hosts: tuple[Host, Host]) -> None:
    _, neighbour = hosts
    assert neighbour.nc is not None
    subject = SUBJECTS.host("bench-07", HostVerb.ARTIFACT)
    with pytest.raises((nats.errors.TimeoutError, nats.errors.NoRespondersError)):
        await neighbour.nc.request(subject, b"{}", timeout=WATCH_S)
    await eventually(lambda: neighbour.violations, message="the server refuses the publish")
    assert any("publish" in v and subject.lower() in v for v in neighbour.violations), neighbour.violations


@pytest.mark.parametrize("who", ["bench-07", "bench-08"])
async def test_no_host_reaches_the_bucket_or_the_uploads(
    secured: SecuredNats, hosts: tuple[Host, Host], who: str
) -> None:
    host = hosts[0] if who == "bench-07" else hosts[1]
    assert host.nc is not None
    nc = host.nc
    heard: list[bytes] = []

    async def hear(msg: nats.aio.msg.Msg) -> None:
        heard.append(msg.data)

    # the bucket's subjects: no subscription, no write (a chunk or a meta of its own would be an object)
    await nc.subscribe(f"$O.{BUCKET}.>", cb=hear)
    await nc.subscribe(SUBJECTS.host_upload_all, cb=hear)
    for subject in (f"$O.{BUCKET}.C.forged", f"$O.{BUCKET}.M.forged"):
        await nc.publish(subject, b"forged")
    await nc.flush()
    # the streams through the JetStream API, directly or mapped the way the host's consumer is
    calls = [
        call
        for api in ("$JS.API", SUBJECTS.host_jetstream_api)
        for stream in (object_stream(BUCKET), SUBJECTS.host_uploads_stream("bench-07"))
        for call in (
            f"{api}.STREAM.INFO.{stream}",
            f"{api}.STREAM.NAMES",
            f"{api}.CONSUMER.CREATE.{stream}",
            f"{api}.STREAM.MSG.GET.{stream}",
            f"{api}.DIRECT.GET.{stream}.$O.{BUCKET}.M.>",
            f"{api}.STREAM.PURGE.{stream}",
        )
    ]

    async def answer(call: str) -> bytes | None:
        try:
            return (await nc.request(call, b'{"seq": 1}', timeout=WATCH_S)).data
        except (nats.errors.TimeoutError, nats.errors.NoRespondersError):
            return None  # refused, or nothing there

    for call, data in zip(calls, await asyncio.gather(*(answer(c) for c in calls)), strict=True):
        if data is not None:  # the host's own account answers `$JS.API` itself: JetStream is not enabled there
            assert SECRET not in data, call
            assert b'"error"' in data, (call, data)
    await eventually(lambda: len(host.violations) >= 4, message="the subscriptions and publishes are refused")
    refused = host.violations
    assert any("subscription" in v and f"$o.{BUCKET}.>".lower() in v for v in refused), refused
    assert any("publish" in v and f"$o.{BUCKET}.c.forged".lower() in v for v in refused), refused
    assert heard == [], "no host hears the bucket or the uploads"
    # and the bucket holds only what the scheduler put there: its one chunk and its meta
    operator = await nats.connect(secured.url("operator"))
    try:
        assert (await operator.jetstream().stream_info(object_stream(BUCKET))).state.messages == 2
    finally:
        await operator.close()
