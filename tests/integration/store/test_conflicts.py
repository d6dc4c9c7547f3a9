"""Every rejected request changes nothing (but the host's sign of life), with the precise code."""

from __future__ import annotations

import dataclasses
import uuid

import pytest

from devsched.core.errors import (
    CancelNotRequested,
    DeviceConflict,
    InvalidRequest,
    LeaseExpired,
    LeaseSuperseded,
    NotFound,
    OutcomeConflict,
    TaskTerminal,
)
from devsched.core.records import LeaseRef
from devsched.core.status import Outcome
from devsched.store import DeviceSpec
from support.store_lab import Lab, snapshot

pytestmark = pytest.mark.integration


async def test_outcome_conflict_changes_nothing(lab: Lab) -> None:
    await lab.host("h1", "d1")
    lease = await lab.running()
    await lab.store.report(lease, Outcome.DONE)
    before = await snapshot(lab.store)
    with pytest.raises(OutcomeConflict) as err:
        await lab.store.report(lease, Outcome.FAILED)
    assert err.value.details == {"recorded": "done", "reported": "failed"}
    assert await snapshot(lab.store) == before


async def test_cancelled_report_without_request_changes_nothing(lab: Lab) -> None:
    await lab.host("h1", "d1")
    lease = await lab.running()
    before = await snapshot(lab.store)
    with pytest.raises(CancelNotRequested):
        await lab.store.report(lease, Outcome.CANCELLED)
    assert await snapshot(lab.store) == before


async def test_terminal_task_rejects_claim_renew_and_new_reports(lab: Lab) -> None:
    await lab.host("h1", "d1")
    lease = await lab.running(max_attempts=1)
    await lab.expire(lease)  # failed at the attempt limit: the attempt is expired, the task terminal
    before = await snapshot(lab.store)
    for call in (lab.store.claim(lease), lab.store.renew(lease), lab.store.report(lease, Outcome.DONE)):
        with pytest.raises(TaskTerminal):
            await call
    assert await snapshot(lab.store) == before


async def test_expired_lease_rejected_before_the_sweep(lab: Lab) -> None:
    await lab.host("h1", "d1")
    lease = await lab.running(lease_ttl_s=10)
    lab.clock.advance(10)  # exactly at expiry counts as expired
    before = await snapshot(lab.store)
    for call in (lab.store.claim(lease), lab.store.renew(lease), lab.store.report(lease, Outcome.DONE)):
        with pytest.raises(LeaseExpired):
            await call
    assert await snapshot(lab.store) == before


async def test_unknown_task_and_unregistered_host_are_not_found(lab: Lab) -> None:
    await lab.host("h1", "d1")
    lease = await lab.running()
    before = await snapshot(lab.store)
    with pytest.raises(NotFound):
        await lab.store.renew(dataclasses.replace(lease, task_id=uuid.uuid4()))
    with pytest.raises(NotFound):
        await lab.store.renew(dataclasses.replace(lease, host_id="never-registered"))
    with pytest.raises(NotFound):
        await lab.store.heartbeat("never-registered")
    with pytest.raises(NotFound):
        await lab.store.get_task(uuid.uuid4())
    with pytest.raises(NotFound):
        await lab.store.request_cancel(uuid.uuid4())
    with pytest.raises(NotFound):
        await lab.store.drain_device("no-such-device", True)
    assert await snapshot(lab.store) == before


async def test_device_registered_by_another_host_is_a_conflict(lab: Lab) -> None:
    await lab.host("h1", "d1")
    before = await snapshot(lab.store, ignore_liveness=False)
    with pytest.raises(DeviceConflict) as err:
        await lab.store.register_host("h2", [DeviceSpec("d2"), DeviceSpec("d1")])
    assert err.value.details == {"devices": {"d1": "h1"}}
    assert await snapshot(lab.store, ignore_liveness=False) == before, "h2 and d2 must not half-register"


async def test_rejected_request_still_counts_as_a_sign_of_life(lab: Lab) -> None:
    await lab.host("h1", "d1")
    lease = await lab.running()
    lab.clock.advance(14)
    stale = LeaseRef("h1", lease.task_id, lease.attempt, uuid.uuid4())
    with pytest.raises(LeaseSuperseded):
        await lab.store.renew(stale)
    (host,) = await lab.store.list_hosts()
    assert host.last_seen_at == lab.clock.current
    assert host.online


async def test_bad_input_is_rejected_by_the_database_too(lab: Lab) -> None:
    before = await snapshot(lab.store)
    with pytest.raises(InvalidRequest):
        await lab.submit(priority=5000)  # the protocol layer rejects this first; the schema is the backstop
    with pytest.raises(InvalidRequest):
        await lab.store.register_host("bad host id", [])
    assert await snapshot(lab.store) == before
