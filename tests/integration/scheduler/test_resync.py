"""The scheduler's resync against real NATS and Postgres: unclaimed assignments published again, on a host's
registration and on a timer, and streams (with the consumers of the hosts it publishes to) created again."""

from __future__ import annotations

from collections.abc import Callable

import nats.errors
import pytest
from nats.aio.client import Client as NatsClient
from nats.js.errors import NotFoundError

from devsched.protocol.subjects import Subjects
from support.polling import eventually
from support.scheduler_harness import (
    Assigned,
    TestHost,
    delete_streams,
    running_scheduler,
    scheduler_settings,
    submit,
)

pytestmark = pytest.mark.integration

MSG_ID = "Nats-Msg-Id"


def _is_copy_of(again: Assigned, first: Assigned) -> bool:
    """The same assignment (body and trace), under a resync's message id."""
    task_id, attempt = first.body["task_id"], first.body["attempt"]
    return (
        again.body == first.body
        and again.headers.get("traceparent") == first.headers.get("traceparent")
        and again.headers[MSG_ID].startswith(f"{task_id}.{attempt}.resync.")
    )


async def _quiet(host: TestHost, seconds: float) -> list[Assigned]:
    """Take what arrives until nothing has for `seconds` (at most 10): copies a pass had in flight."""
    late: list[Assigned] = []
    while len(late) < 10:
        try:
            late.append(await host.next_assignment(seconds))
        except AssertionError:  # nothing came
            break
    return late


async def test_a_registration_publishes_the_hosts_unclaimed_assignments_again(
    database_url: str, nats_url: str, subject_prefix: str, nc: NatsClient, make_host: Callable[..., TestHost]
) -> None:
    settings = scheduler_settings(database_url, nats_url, subject_prefix, resync_interval_s=0)  # no timer
    try:
        async with running_scheduler(settings):
            host = make_host()
            await host.register("d1")
            task_id = await submit(nc, subject_prefix)
            first = await host.next_assignment()  # acked, never claimed: as if the stream had lost it
            assert first.headers[MSG_ID] == f"{task_id}.1"
            assert await host.no_assignment(1.2)  # older now than a registration's resend takes (1 s)

            await host.register("d1")  # the agent came back
            again = await host.next_assignment()
            assert _is_copy_of(again, first), (again.headers, first.headers)

            await host.claim(again)
            await host.register("d1")
            assert await host.no_assignment(1.0), "a claimed attempt is not published again"
    finally:
        await delete_streams(nc, subject_prefix)


async def test_the_timer_publishes_again_what_stays_unclaimed_until_it_is_claimed(
    database_url: str, nats_url: str, subject_prefix: str, nc: NatsClient, make_host: Callable[..., TestHost]
) -> None:
    settings = scheduler_settings(database_url, nats_url, subject_prefix, resync_interval_s=0.2, resync_after_s=1.0)
    try:
        async with running_scheduler(settings) as scheduler:
            host = make_host()
            await host.register("d1")
            await submit(nc, subject_prefix)
            first = await host.next_assignment()
            assert await host.no_assignment(0.5), "nothing before the attempt is resync_after_s old"
            again = await host.next_assignment(5)
            assert _is_copy_of(again, first)
            assert scheduler.resync is not None
            assert scheduler.resync.resent >= 1

            await host.claim(again)
            late = await _quiet(host, 1.5)  # a pass that read before the claim may still publish its copy
            assert len(late) <= 1, f"copies went on after the claim: {[a.headers[MSG_ID] for a in late]}"
    finally:
        await delete_streams(nc, subject_prefix)


async def test_the_timer_creates_lost_streams_and_the_consumer_of_a_host_it_publishes_to(
    database_url: str, nats_url: str, subject_prefix: str, nc: NatsClient, make_host: Callable[..., TestHost]
) -> None:
    settings = scheduler_settings(database_url, nats_url, subject_prefix, resync_interval_s=0.2, resync_after_s=0.5)
    js = nc.jetstream()
    names = Subjects(subject_prefix)
    try:
        async with running_scheduler(settings):
            host = make_host()
            await host.register("d1")
            await submit(nc, subject_prefix)
            first = await host.next_assignment()
            # NATS lost its store: both streams, and the host's consumer with them.
            await delete_streams(nc, subject_prefix)

            async def streams_back() -> bool:
                try:
                    await js.stream_info(names.assignments_stream)
                    await js.stream_info(names.events_stream)
                    await js.consumer_info(names.assignments_stream, f"host-{host.host_id}")
                except (NotFoundError, nats.errors.TimeoutError):
                    return False
                return True

            await eventually(streams_back, timeout=10, message="streams and the host's consumer created again")
            # No registration since: the host's pull subscription is served by the consumer made again.
            again = await host.next_assignment(10)
            assert _is_copy_of(again, first)
    finally:
        await delete_streams(nc, subject_prefix)
