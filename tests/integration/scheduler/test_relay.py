"""The relay's two ways out, against a real JetStream: a replica's own commits published at once and marked
in batches later, and the pass over the table for what nobody is publishing."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import pytest
from nats.aio.client import Client as NatsClient

from devsched.protocol.subjects import Subjects
from devsched.scheduler.app import Scheduler
from devsched.scheduler.jetstream import ensure_streams
from devsched.scheduler.loops import Wakeup
from devsched.scheduler.relay import Relay
from devsched.scheduler.settings import SchedulerSettings
from devsched.store import Committed, ManualClock, NewTask, Store
from support.polling import eventually
from support.scheduler_harness import (
    TestHost,
    delete_streams,
    running_scheduler,
    scheduler_settings,
    stream_messages,
    submit,
)
from support.store_lab import PLAN

pytestmark = pytest.mark.integration


@pytest.fixture
async def parts(
    database_url: str, nats_url: str, subject_prefix: str, nc: NatsClient
) -> AsyncIterator[tuple[Store, Relay, ManualClock]]:
    """A store that hands its commits to a relay (the scheduler's wiring, without the loops)."""
    settings = scheduler_settings(database_url, nats_url, subject_prefix, relay_mark_delay_s=0.05)
    clock = ManualClock()
    store = Store.connect(settings.database_url, clock=clock)
    js = nc.jetstream()
    subjects = Subjects(subject_prefix)
    await ensure_streams(js, subjects, settings)
    relay = Relay(store, js, subjects, settings, Wakeup())
    store.on_commit = relay.offer
    relay.start()
    try:
        yield store, relay, clock
    finally:
        await relay.stop()
        await store.close()
        await delete_streams(nc, subject_prefix)


async def events_in_stream(nc: NatsClient, prefix: str) -> int:
    return len(await stream_messages(nc.jetstream(), Subjects(prefix).events_stream))


async def test_a_commit_is_published_at_once_and_marked_by_the_next_pass(
    parts: tuple[Store, Relay, ManualClock], nc: NatsClient, subject_prefix: str
) -> None:
    store, relay, _ = parts
    assert await relay.step() is False  # the first pass (a full one) finds nothing
    for _ in range(3):
        await store.submit(NewTask(plan=PLAN))
    await eventually(lambda: events_in_stream(nc, subject_prefix), message="published without a pass")
    await eventually(lambda: relay.published == 3, message="all three acknowledged")
    assert await store.unsent_count() == 3, "not marked yet: one transaction marks them later"
    assert await relay.step() is False
    assert await store.unsent_count() == 0
    assert relay.duplicates == 0
    assert await events_in_stream(nc, subject_prefix) == 3


async def test_a_routine_pass_leaves_young_rows_to_their_writer_and_a_full_pass_takes_them(
    parts: tuple[Store, Relay, ManualClock], nc: NatsClient, subject_prefix: str, database_url: str
) -> None:
    store, relay, clock = parts
    relay_grace_s = SchedulerSettings.model_fields["relay_grace_s"].default
    assert await relay.step() is False  # the first pass is a full one
    other = Store.connect(database_url, clock=clock)  # another process: nobody hears of its commits
    try:
        heard: list[Committed] = []
        other.on_commit = heard.append
        await other.submit(NewTask(plan=PLAN))
        assert await relay.step() is False
        assert await store.unsent_count() == 1, "young: its writer may be publishing it"
        relay.request_full_pass()  # what the sweeper's wake-up does
        assert await relay.step() is False
        assert await store.unsent_count() == 0
        await other.submit(NewTask(plan=PLAN))
        clock.advance(relay_grace_s)
        assert await relay.step() is False
        assert await store.unsent_count() == 0, "old enough: whoever wrote it did not publish it"
    finally:
        await other.close()
    assert await events_in_stream(nc, subject_prefix) == 2


async def test_stopping_publishes_what_was_offered(
    parts: tuple[Store, Relay, ManualClock], nc: NatsClient, subject_prefix: str
) -> None:
    store, relay, _ = parts
    await relay.stop()  # no sender any more: what is offered waits for the last publication
    await store.submit(NewTask(plan=PLAN))
    assert await events_in_stream(nc, subject_prefix) == 0
    await relay.stop()
    assert relay.published == 1
    assert await events_in_stream(nc, subject_prefix) == 1
    assert await relay.step() is False
    assert await store.unsent_count() == 0


async def test_a_lifecycle_needs_no_relay_pass_but_the_marks(
    database_url: str, nats_url: str, subject_prefix: str, nc: NatsClient, make_host: Callable[..., TestHost]
) -> None:
    """With the relay's periodic pass far away, a task still flows: every message went out at once."""
    settings = scheduler_settings(database_url, nats_url, subject_prefix, relay_tick_s=3600, assign_tick_s=3600)
    async with running_scheduler(settings) as scheduler:
        host = make_host()
        await host.register("d1")
        assert scheduler.assigner is not None
        # the first pass, and the one the registration asked for (it may have new devices)
        await eventually(lambda: scheduler.assigner is not None and scheduler.assigner.passes == 2)
        task_id = await submit(nc, subject_prefix)
        a = await host.next_assignment()
        assert a.task_id == task_id
        await host.claim(a)
        await host.report(a)
        await eventually(lambda: _unsent_zero(scheduler), message="marked by the passes the marks asked for")
        assert scheduler.relay is not None
        assert scheduler.relay.duplicates == 0
        assert scheduler.assigner.passes == 2, "no more passes: the requests assigned themselves"
    await delete_streams(nc, subject_prefix)


async def _unsent_zero(scheduler: Scheduler) -> bool:
    assert scheduler.relay is not None
    return await scheduler.relay._store.unsent_count() == 0
