"""The control plane's side of spec/host-agent.md, at the repository level.

The agent's own side (stopping, choosing the outcome) is tested end to end in tests/e2e.
"""

from __future__ import annotations

import dataclasses
import uuid

import pytest

from devsched.core.errors import LeaseExpired, LeaseForeign, LeaseSuperseded
from devsched.core.status import AttemptStatus, Outcome, TaskStatus
from support.store_lab import Lab, snapshot

pytestmark = pytest.mark.integration

RESULT = {"steps": [{"name": "flash", "status": "done", "exit_code": 0, "output_tail": "ok"}]}


async def test_lease_renewal_succeeds(lab: Lab) -> None:
    await lab.host("h1", "d1")
    lease = await lab.running(lease_ttl_s=20)
    before = (await lab.store.get_task(lease.task_id)).attempts[-1]
    lab.clock.advance(15)
    grant = await lab.store.renew(lease, {"step": "flash", "index": 0, "of": 1})
    after = (await lab.store.get_task(lease.task_id)).attempts[-1]
    assert grant.expires_at > before.expires_at
    assert after.expires_at == grant.expires_at
    assert (after.attempt, after.lease_id, after.device_id, after.host_id) == (
        before.attempt,
        before.lease_id,
        before.device_id,
        before.host_id,
    )
    assert after.progress == {"step": "flash", "index": 0, "of": 1}


async def test_lease_is_stale_or_foreign(lab: Lab) -> None:
    await lab.host("h1", "d1")
    await lab.host("h2", "d2")
    lease = await lab.running(device_id="d1")
    untouched = await snapshot(lab.store)

    with pytest.raises(LeaseForeign):
        await lab.store.renew(dataclasses.replace(lease, host_id="h2"))
    with pytest.raises(LeaseSuperseded):
        await lab.store.renew(dataclasses.replace(lease, lease_id=uuid.uuid4()))
    with pytest.raises(LeaseSuperseded):
        await lab.store.renew(dataclasses.replace(lease, attempt=2))
    assert await snapshot(lab.store) == untouched

    lab.clock.advance(31)
    with pytest.raises(LeaseExpired):  # expired by the clock, before any sweep
        await lab.store.renew(lease)
    assert await snapshot(lab.store) == untouched, "a rejected renewal must not revive or alter the attempt"
    await lab.alive()
    await lab.store.sweep_expired()
    with pytest.raises(LeaseExpired):  # and after the sweep ended it
        await lab.store.renew(lease)
    view = await lab.store.get_task(lease.task_id)
    assert view.status is TaskStatus.QUEUED
    assert view.attempts[-1].status is AttemptStatus.EXPIRED


async def test_report_a_successful_result(lab: Lab) -> None:
    await lab.host("h1", "d1")
    lease = await lab.running()
    receipt = await lab.store.report(lease, Outcome.DONE, result=RESULT)
    view = await lab.store.get_task(lease.task_id)
    assert receipt.status is TaskStatus.DONE
    assert view.status is TaskStatus.DONE
    assert view.result == RESULT
    assert view.attempts[-1].result == RESULT
    assert [d.state.value for h in await lab.store.list_hosts() for d in h.devices] == ["available"]


async def test_report_a_cancelled_result(lab: Lab) -> None:
    await lab.host("h1", "d1")
    lease = await lab.running()
    await lab.store.request_cancel(lease.task_id, reason="abort")
    receipt = await lab.store.report(lease, Outcome.CANCELLED, reason="cancelled at step boundary", result=RESULT)
    view = await lab.store.get_task(lease.task_id)
    assert receipt.status is TaskStatus.CANCELLED
    assert view.status is TaskStatus.CANCELLED
    assert view.reason == "cancelled at step boundary"
    assert view.result == RESULT
    assert [d.state.value for h in await lab.store.list_hosts() for d in h.devices] == ["available"]


async def test_retry_a_result_after_response_loss(lab: Lab) -> None:
    await lab.host("h1", "d1")
    lease = await lab.running()
    first = await lab.store.report(lease, Outcome.DONE, result=RESULT)
    before = await snapshot(lab.store)
    lab.clock.advance(5)
    again = await lab.store.report(lease, Outcome.DONE, result={"steps": []}, reason="different text")
    assert again.duplicate
    assert again.status is TaskStatus.DONE
    assert again.recorded_at == first.recorded_at
    assert await snapshot(lab.store) == before, "a duplicate creates no attempt, event or change"
    view = await lab.store.get_task(lease.task_id)
    assert len(view.attempts) == 1
    assert view.result == RESULT, "the first report's result stands"


async def test_stale_attempt_reports_after_requeue(lab: Lab) -> None:
    await lab.host("h1", "d1")
    first = await lab.running()
    await lab.expire(first)
    lab.clock.advance(31)
    await lab.alive()
    second = await lab.assign_one(first.task_id)
    await lab.store.claim(second)
    before = await snapshot(lab.store)
    for outcome in Outcome:
        with pytest.raises(LeaseSuperseded):
            await lab.store.report(first, outcome)
    assert await snapshot(lab.store) == before
    view = await lab.store.get_task(first.task_id)
    assert view.status is TaskStatus.DISPATCHED
    assert view.attempts[-1].lease_id == second.lease_id
