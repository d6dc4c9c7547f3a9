"""Every scenario of spec/scheduler-repository.md, at the repository level."""

from __future__ import annotations

import pytest

from devsched.core.errors import LeaseSuperseded, TaskTerminal
from devsched.core.status import AttemptStatus, EndReason, Outcome, TaskReason, TaskStatus
from devsched.store import Store
from support.store_lab import Lab

pytestmark = pytest.mark.integration


async def _reservations(store: Store, device_id: str) -> list[str]:
    """Active reservations of a device, read through the listing operators use."""
    hosts = await store.list_hosts()
    return [d.state.value for h in hosts for d in h.devices if d.device_id == device_id]


async def test_active_lease_reports_completion(lab: Lab) -> None:
    await lab.host("h1", "d1")
    for outcome in (Outcome.DONE, Outcome.FAILED):
        lease = await lab.running()
        receipt = await lab.store.report(lease, outcome, reason="x" if outcome is Outcome.FAILED else None)
        assert receipt.status is outcome.task_status
        assert not receipt.duplicate
        view = await lab.store.get_task(lease.task_id)
        assert view.status is outcome.task_status
        assert [a.status for a in view.attempts] == [outcome.attempt_status]
        assert await _reservations(lab.store, "d1") == ["available"]
    # cancelled, the third terminal outcome, needs a request first
    lease = await lab.running()
    await lab.store.request_cancel(lease.task_id)
    assert (await lab.store.report(lease, Outcome.CANCELLED)).status is TaskStatus.CANCELLED
    assert await _reservations(lab.store, "d1") == ["available"]


async def test_superseded_lease_reports_completion(lab: Lab) -> None:
    await lab.host("h1", "d1")
    first = await lab.running(max_attempts=3)
    await lab.expire(first)
    lab.clock.advance(31)  # past the device's post-expiry grace
    await lab.alive()
    second = await lab.assign_one(first.task_id)
    assert second.attempt == 2
    with pytest.raises(LeaseSuperseded):
        await lab.store.report(first, Outcome.DONE)
    view = await lab.store.get_task(first.task_id)
    assert view.status is TaskStatus.ASSIGNED
    assert view.attempts[-1].status is AttemptStatus.ACTIVE
    assert view.attempts[-1].lease_id == second.lease_id


async def test_lease_expires_with_attempts_remaining(lab: Lab) -> None:
    await lab.host("h1", "d1")
    lease = await lab.running(max_attempts=2)
    await lab.expire(lease)
    view = await lab.store.get_task(lease.task_id)
    assert view.status is TaskStatus.QUEUED
    assert view.reason is None
    (attempt,) = view.attempts
    assert attempt.status is AttemptStatus.EXPIRED
    assert attempt.end_reason is EndReason.LEASE_EXPIRED
    assert attempt.ended_at is not None
    assert attempt.lease_id == lease.lease_id
    assert await _reservations(lab.store, "d1") == ["available"]


async def test_lease_expires_at_attempt_limit(lab: Lab) -> None:
    await lab.host("h1", "d1")
    lease = await lab.running(max_attempts=1)
    await lab.expire(lease)
    view = await lab.store.get_task(lease.task_id)
    assert view.status is TaskStatus.FAILED
    assert view.reason == TaskReason.LEASE_EXPIRED
    assert view.attempts[0].end_reason is EndReason.LEASE_EXPIRED
    assert await _reservations(lab.store, "d1") == ["available"]


async def test_lease_expires_with_a_cancellation_pending(lab: Lab) -> None:
    await lab.host("h1", "d1")
    for max_attempts in (1, 3):  # regardless of remaining attempts
        lease = await lab.running(max_attempts=max_attempts)
        await lab.store.request_cancel(lease.task_id, reason="user asked")
        await lab.expire(lease)
        view = await lab.store.get_task(lease.task_id)
        assert view.status is TaskStatus.CANCELLED
        assert view.reason == TaskReason.CANCELLED_AFTER_LEASE_EXPIRED
        assert view.attempts[-1].status is AttemptStatus.EXPIRED
        assert await _reservations(lab.store, "d1") == ["available"]
        lab.clock.advance(31)
        await lab.alive()


async def test_cancelled_status_is_a_valid_terminal_state(lab: Lab) -> None:
    await lab.host("h1", "d1")
    queued = await lab.submit(labels={"platform": "ios"})  # matches nothing: stays queued
    assert (await lab.store.request_cancel(queued)).status is TaskStatus.CANCELLED
    assert (await lab.store.get_task(queued)).reason == TaskReason.CANCELLED_WHILE_QUEUED

    lease = await lab.running()
    await lab.store.request_cancel(lease.task_id)
    await lab.store.report(lease, Outcome.CANCELLED)
    for task_id in (queued, lease.task_id):
        assert (await lab.store.get_task(task_id)).status is TaskStatus.CANCELLED
    # no further assignment, claim or renewal is accepted
    assert all(m.task_id not in (queued, lease.task_id) for m in await lab.store.assign())
    with pytest.raises(TaskTerminal):
        await lab.store.claim(lease)
    with pytest.raises(TaskTerminal):
        await lab.store.renew(lease)
    cancel_again = await lab.store.request_cancel(lease.task_id)
    assert cancel_again.status is TaskStatus.CANCELLED
    assert not cancel_again.cancel_requested


async def test_cancellation_request_survives_a_restart(lab: Lab, database_url: str) -> None:
    await lab.host("h1", "d1")
    lease = await lab.running()
    receipt = await lab.store.request_cancel(lease.task_id, reason="stop it")
    assert receipt.cancel_requested
    assert receipt.status is TaskStatus.DISPATCHED
    await lab.store.close()  # the control plane goes away: no state survives in memory

    restarted = Store.connect(database_url, clock=lab.clock)
    try:
        assert (await restarted.get_task(lease.task_id)).cancel_requested
        grant = await restarted.renew(lease)
        assert grant.cancel_requested
    finally:
        await restarted.close()


async def test_renewal_on_a_task_with_a_pending_cancellation(lab: Lab) -> None:
    await lab.host("h1", "d1")
    lease = await lab.running(lease_ttl_s=30)
    await lab.store.request_cancel(lease.task_id)
    lab.clock.advance(10)
    grant = await lab.store.renew(lease)
    assert grant.cancel_requested
    assert (grant.expires_at - lab.clock.current).total_seconds() == 30
    view = await lab.store.get_task(lease.task_id)
    assert view.status is TaskStatus.DISPATCHED
    assert view.attempts[-1].expires_at == grant.expires_at


async def test_renewal_on_a_task_without_a_pending_cancellation(lab: Lab) -> None:
    await lab.host("h1", "d1")
    lease = await lab.running(lease_ttl_s=30)
    lab.clock.advance(10)
    grant = await lab.store.renew(lease)
    assert not grant.cancel_requested
    assert (grant.expires_at - lab.clock.current).total_seconds() == 30
    assert (await lab.store.get_task(lease.task_id)).attempts[-1].expires_at == grant.expires_at
