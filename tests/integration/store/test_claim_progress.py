"""A claim that carries the first step's progress does, in its one statement, what a claim and then a
renewal with that progress would: dispatched, lease extended, progress kept, `dispatched` then `progress`.

`test_grants.py` checks the one statement against the locked path on generated states; these check the
outcome itself, through the Store as the scheduler calls it.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Sequence

import pytest

from devsched.core.errors import LeaseExpired, LeaseForeign, LeaseSuperseded
from devsched.core.events import StepProgress, TaskEvent
from devsched.core.records import LeaseRef
from devsched.core.status import EventKind, Outcome, TaskStatus
from devsched.store import Committed, OutboxMessage, Published
from support.store_lab import Lab, snapshot

pytestmark = pytest.mark.integration

FIRST = {"step": "flash", "index": 0, "of": 2}
SECOND = {"step": "test", "index": 1, "of": 2}


def task_events(messages: Sequence[OutboxMessage]) -> list[TaskEvent]:
    return [m.event for m in messages if isinstance(m.event, TaskEvent)]


async def assigned(lab: Lab) -> LeaseRef:
    await lab.host("h1", "d1")
    return await lab.assign_one(await lab.submit())


async def published(lab: Lab) -> list[TaskEvent]:
    """Every task event in the order the relay publishes them (outbox ids)."""
    got: list[OutboxMessage] = []

    async def publish(batch: Sequence[OutboxMessage]) -> Published:
        got.extend(batch)
        return Published([m.id for m in batch])

    await lab.store.relay_outbox(publish, limit=1000)
    return task_events(got)


async def test_a_claim_with_progress_dispatches_and_records_the_step_in_one_commit(lab: Lab) -> None:
    lease = await assigned(lab)
    heard: list[Committed] = []
    lab.store.on_commit = heard.append
    before = (await lab.store.get_task(lease.task_id)).attempts[-1]
    lab.clock.advance(5)
    grant = await lab.store.claim(lease, FIRST)

    (commit,) = heard  # one statement, one commit
    assert commit.operation == "claim"
    dispatched, progress = task_events(commit.messages)
    assert (dispatched.event, progress.event) == (EventKind.DISPATCHED, EventKind.PROGRESS)
    assert (dispatched.seq, progress.seq) == (3, 4), "submitted 1, assigned 2, then consecutive"
    assert commit.messages[0].id < commit.messages[1].id, "published in that order"
    assert progress.progress == StepProgress(step="flash", index=0, of=2)
    for event in (dispatched, progress):
        assert event.status is TaskStatus.DISPATCHED
        assert (event.host_id, event.device_id, event.attempt) == ("h1", "d1", 1)
    assert dispatched.at == progress.at

    view = await lab.store.get_task(lease.task_id)
    after = view.attempts[-1]
    assert view.status is TaskStatus.DISPATCHED
    assert after.progress == FIRST
    assert after.dispatched_at is not None
    assert after.expires_at == grant.expires_at > before.expires_at
    assert (grant.dispatch, grant.cancel_requested) == (True, False)
    assert [(e.event, e.seq) for e in await published(lab)] == [
        (EventKind.SUBMITTED, 1),
        (EventKind.ASSIGNED, 2),
        (EventKind.DISPATCHED, 3),
        (EventKind.PROGRESS, 4),
    ]


async def test_the_renewal_it_replaces_would_have_changed_nothing_more(lab: Lab) -> None:
    lease = await assigned(lab)
    await lab.store.claim(lease, FIRST)
    heard: list[Committed] = []
    lab.store.on_commit = heard.append
    await lab.store.renew(lease, FIRST)
    assert not [e for c in heard for e in task_events(c.messages)], "the same step again: no event"
    await lab.store.renew(lease, SECOND)
    assert [e.event for e in task_events(heard[-1].messages)] == [EventKind.PROGRESS]
    assert [e.seq for e in task_events(heard[-1].messages)] == [5]
    assert (await lab.store.get_task(lease.task_id)).attempts[-1].progress == SECOND


async def test_a_claim_without_progress_is_as_before(lab: Lab) -> None:
    lease = await assigned(lab)
    heard: list[Committed] = []
    lab.store.on_commit = heard.append
    grant = await lab.store.claim(lease)
    assert [e.event for e in task_events(heard[0].messages)] == [EventKind.DISPATCHED]
    assert grant.dispatch
    assert (await lab.store.get_task(lease.task_id)).attempts[-1].progress is None


async def test_a_repeated_claim_with_progress_is_a_renewal_with_progress(lab: Lab) -> None:
    lease = await assigned(lab)
    await lab.store.claim(lease, FIRST)
    heard: list[Committed] = []
    lab.store.on_commit = heard.append

    lab.clock.advance(5)
    again = await lab.store.claim(lease, FIRST)  # the first reply was lost: the same step
    assert not again.dispatch
    assert not [e for c in heard for e in task_events(c.messages)]

    lab.clock.advance(5)
    moved_on = await lab.store.claim(lease, SECOND)
    assert not moved_on.dispatch
    (progress,) = task_events(heard[-1].messages)
    assert (progress.event, progress.seq, progress.status) == (EventKind.PROGRESS, 5, TaskStatus.DISPATCHED)
    assert progress.progress == StepProgress(step="test", index=1, of=2)
    view = await lab.store.get_task(lease.task_id)
    assert (view.status, view.attempts[-1].progress) == (TaskStatus.DISPATCHED, SECOND)
    assert view.attempts[-1].expires_at == moved_on.expires_at > again.expires_at

    lab.clock.advance(5)
    heard.clear()
    plain = await lab.store.claim(lease)  # without progress: the attempt keeps its own
    assert not [e for c in heard for e in task_events(c.messages)]
    assert plain.expires_at > moved_on.expires_at
    assert (await lab.store.get_task(lease.task_id)).attempts[-1].progress == SECOND


async def test_a_cancellation_pending_at_claim_is_in_the_reply(lab: Lab) -> None:
    lease = await assigned(lab)
    await lab.store.request_cancel(lease.task_id, reason="not now")
    grant = await lab.store.claim(lease, FIRST)
    assert grant.cancel_requested
    # the progress is kept as a renewal's would be; the agent stops before the step starts
    assert (await lab.store.get_task(lease.task_id)).attempts[-1].progress == FIRST
    await lab.store.report(lease, Outcome.CANCELLED)
    assert (await lab.store.get_task(lease.task_id)).status is TaskStatus.CANCELLED


async def test_a_stale_or_foreign_claim_with_progress_changes_nothing(lab: Lab) -> None:
    await lab.host("h2", "d2")
    lease = await assigned(lab)
    untouched = await snapshot(lab.store)
    stale = [
        (dataclasses.replace(lease, lease_id=uuid.uuid4()), LeaseSuperseded),
        (dataclasses.replace(lease, attempt=2), LeaseSuperseded),
        (dataclasses.replace(lease, host_id="h2"), LeaseForeign),
    ]
    for wrong, error in stale:
        with pytest.raises(error):
            await lab.store.claim(wrong, FIRST)
        assert await snapshot(lab.store) == untouched, wrong

    lab.clock.advance(31)  # past the assignment's lease, before the sweep
    await lab.alive()
    untouched = await snapshot(lab.store)
    with pytest.raises(LeaseExpired):
        await lab.store.claim(lease, FIRST)
    assert await snapshot(lab.store) == untouched
