"""Streams, consumers and the outbox relay against a real nats-server with JetStream."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest
from nats.aio.client import Client as NatsClient
from nats.js.api import RetentionPolicy, StorageType
from sqlalchemy import text

from devsched.protocol.subjects import Subjects
from devsched.scheduler.app import Scheduler
from devsched.store import Store
from support.outbox_rows import FORGET_PUBLISHED
from support.polling import eventually
from support.scheduler_harness import (
    TestHost,
    delete_streams,
    running_scheduler,
    scheduler_settings,
    stream_messages,
    submit,
)

pytestmark = pytest.mark.integration


async def test_streams_are_created_with_production_settings_and_updated_idempotently(
    database_url: str, nats_url: str, subject_prefix: str, nc: NatsClient
) -> None:
    js = nc.jetstream()
    pu = subject_prefix.upper()
    try:
        settings = scheduler_settings(database_url, nats_url, subject_prefix)
        async with running_scheduler(settings):
            assignments = await js.stream_info(f"{pu}_ASSIGNMENTS")
            events = await js.stream_info(f"{pu}_EVENTS")
            revoked = await js.stream_info(f"KV_{pu}_WEB_REVOKED")
            host = TestHost(nc, subject_prefix, "h-streams")
            await host.register("d-streams", bind=False)
            logs = await js.stream_info(f"{pu}_LOGS_h-streams")
            uploads = await js.stream_info(f"{pu}_UPLOADS_h-streams")
        assert logs.config.subjects == [f"{subject_prefix}.host.h-streams.log.>"]
        assert logs.config.retention == RetentionPolicy.LIMITS
        assert logs.config.storage == StorageType.FILE
        share = settings.logs_max_bytes // settings.max_hosts
        assert (logs.config.max_age, logs.config.max_bytes, logs.config.discard) == (7 * 86400, share, "old")
        assert uploads.config.subjects == [f"{subject_prefix}.host.h-streams.upload.>"]
        share = settings.uploads_max_bytes // settings.max_hosts
        assert (uploads.config.max_bytes, uploads.config.discard) == (share, "new")
        assert events.config.max_bytes == settings.events_max_bytes
        assert assignments.config.subjects == [f"{subject_prefix}.assign.>"]
        assert assignments.config.retention == RetentionPolicy.WORK_QUEUE
        assert assignments.config.storage == StorageType.FILE
        assert assignments.config.max_age == 86400
        assert assignments.config.duplicate_window == 300
        assert events.config.subjects == [f"{subject_prefix}.events.>"]
        assert events.config.retention == RetentionPolicy.LIMITS
        assert events.config.max_age == 7 * 86400
        # the dashboard's logged-out sessions: a key-value bucket, each entry with its own TTL, append-only
        assert revoked.config.subjects == [f"$KV.{pu}_WEB_REVOKED.>"]
        assert revoked.config.max_msgs_per_subject == 1
        assert (revoked.config.max_bytes, revoked.config.discard) == (settings.revoked_sessions_max_bytes, "new")
        assert revoked.config.allow_msg_ttl
        assert (revoked.config.deny_delete, revoked.config.deny_purge, revoked.config.allow_rollup_hdrs) == (
            True,
            True,
            False,
        )

        # A second start with the same settings changes nothing; changed limits are applied in place.
        async with running_scheduler(
            scheduler_settings(database_url, nats_url, subject_prefix, events_max_age_s=3600.0)
        ):
            assert (await js.stream_info(f"{pu}_EVENTS")).config.max_age == 3600
            assert (await js.stream_info(f"{pu}_ASSIGNMENTS")).config.retention == RetentionPolicy.WORK_QUEUE
        async with running_scheduler(
            scheduler_settings(database_url, nats_url, subject_prefix, logs_max_age_s=7200.0, logs_max_bytes=10**9)
        ):
            want = (7200, 10**9 // settings.max_hosts)

            async def logs_limits() -> bool:  # made again at the start for the known host, in the background
                logs = await js.stream_info(f"{pu}_LOGS_h-streams")
                return (logs.config.max_age, logs.config.max_bytes) == want

            await eventually(logs_limits, message="the host's logs stream brought to the new limits")
    finally:
        await delete_streams(nc, subject_prefix)


async def test_host_consumer_is_durable_explicit_ack_and_idempotent(
    scheduler: Scheduler, subject_prefix: str, make_host: Callable[..., TestHost]
) -> None:
    host = make_host()
    await host.register("d1")
    await host.register("d1", "d2")  # again: the same consumer, no error
    info = await host.js.consumer_info(Subjects(subject_prefix).assignments_stream, f"host-{host.host_id}")
    assert info.config.ack_policy == "explicit"
    assert info.config.ack_wait == 30
    assert info.config.max_deliver == 10


async def counts_are(counts: Callable[[], Awaitable[dict[str, int]]], expected: dict[str, int]) -> bool:
    return await counts() == expected


async def test_relay_republish_after_a_crash_before_the_mark_is_deduplicated(
    scheduler: Scheduler, nc: NatsClient, subject_prefix: str, database_url: str, make_host: Callable[..., TestHost]
) -> None:
    host = make_host()
    await host.register("d1")
    for _ in range(3):
        await submit(nc, subject_prefix)
    store = Store.connect(database_url)
    try:
        js = nc.jetstream()

        async def counts() -> dict[str, int]:
            return {
                s: (await js.stream_info(f"{subject_prefix.upper()}_{s}")).state.messages
                for s in ("EVENTS", "ASSIGNMENTS")
            }

        # the outbox can be empty before the assignment pass has committed: wait for its messages too
        before = {"EVENTS": 4, "ASSIGNMENTS": 1}
        await eventually(lambda: counts_are(counts, before), message="3 submitted + 1 assigned relayed")
        await eventually(lambda: _unsent_is_zero(store), message="outbox relayed")
        # What a relay that died after JetStream acked but before its mark committed leaves behind:
        async with store.engine.begin() as conn:
            await conn.execute(text(FORGET_PUBLISHED))
        assert scheduler.relay is not None
        duplicates = scheduler.relay.duplicates
        scheduler.relay_wakeup.set()
        await eventually(lambda: _unsent_is_zero(store), message="outbox relayed again")
        assert scheduler.relay.duplicates == duplicates + 5
        assert await counts() == before
        assert len(await stream_messages(js, Subjects(subject_prefix).events_stream)) == 4
    finally:
        await store.close()


async def _unsent_is_zero(store: Store) -> bool:
    return await store.unsent_count() == 0


async def test_relay_recreates_a_deleted_stream_and_delivers(
    scheduler: Scheduler, nc: NatsClient, subject_prefix: str, make_host: Callable[..., TestHost]
) -> None:
    host = make_host()
    await host.register("d1")
    js = nc.jetstream()
    await js.delete_stream(Subjects(subject_prefix).events_stream)
    task_id = await submit(nc, subject_prefix)
    assert (await host.next_assignment()).task_id == task_id

    async def events_back() -> int:
        try:
            return (await js.stream_info(Subjects(subject_prefix).events_stream)).state.messages
        except Exception:
            return 0

    assert await eventually(events_back, message="events stream recreated and filled") >= 1


async def test_registration_recreates_a_deleted_assignments_stream(
    scheduler: Scheduler, nc: NatsClient, subject_prefix: str, make_host: Callable[..., TestHost]
) -> None:
    await nc.jetstream().delete_stream(Subjects(subject_prefix).assignments_stream)
    host = make_host()
    await host.register("d1")
    task_id = await submit(nc, subject_prefix)
    assert (await host.next_assignment()).task_id == task_id
