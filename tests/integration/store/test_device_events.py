"""Device events against a real Postgres (issue 13 item 1): a quarantine and a return commit their event.

Each change that quarantines a device (its infrastructure failures reaching the threshold, a failed
health check) or returns a quarantined one (a passing health check, an operator's `drain --undo` of the
device or its host) writes one `device_event` outbox row in its own transaction; a change that does
neither (already quarantined, not quarantined) writes none. The relay claims only the kinds it knows.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Sequence

import pytest
from sqlalchemy import text

from devsched.core.events import DeviceEvent, DeviceEventCause, DeviceEventKind
from devsched.core.health import HEALTH_CHECK_FAILED
from devsched.core.records import LeaseRef
from devsched.core.status import Outcome, TaskKind, TaskStatus
from devsched.store import Committed, ManualClock, OutboxMessage, Published, Store
from devsched.store import outbox as outbox_module
from support.store_lab import Lab

pytestmark = pytest.mark.integration

CHECK = {"steps": [{"name": "adb-alive", "action": "noop", "args": {}}]}
INFRA = {"steps": [{"name": "flash", "action": "noop", "args": {}, "infra": True}]}
FLASH_FAILED = {"steps": [{"name": "flash", "status": "failed", "exit_code": 1}]}
ENDED = (TaskStatus.DONE, TaskStatus.FAILED, TaskStatus.CANCELLED)


@pytest.fixture
async def heard(database_url: str, clock: ManualClock) -> AsyncIterator[tuple[Lab, list[Committed]]]:
    """A lab whose `on_commit` collects every commit's messages (the rows each transaction wrote)."""
    store = Store.connect(database_url, clock=clock)
    commits: list[Committed] = []
    store.on_commit = commits.append
    try:
        yield Lab(store, clock), commits
    finally:
        await store.close()


def device_events(commits: Sequence[Committed]) -> list[DeviceEvent]:
    return [m.event for c in commits for m in c.messages if isinstance(m.event, DeviceEvent)]


async def device_rows(store: Store) -> int:
    async with store.engine.connect() as conn:
        return int((await conn.execute(text("SELECT count(*) FROM outbox WHERE kind = 'device_event'"))).scalar_one())


async def fail_infra(lab: Lab, device_id: str = "d1") -> list[Committed]:
    """An infra failure reported on `device_id`; the commits of the report."""
    lease = await lab.running(plan=INFRA, device_id=device_id)
    return await committed(lab, lab.store.report(lease, Outcome.FAILED, reason="flash failed", result=FLASH_FAILED))


async def committed(lab: Lab, op: Awaitable[object]) -> list[Committed]:
    """The commits `op` (an awaitable store call) made."""
    commits: list[Committed] = []
    before = lab.store.on_commit
    lab.store.on_commit = commits.append
    try:
        await op
    finally:
        lab.store.on_commit = before
    return commits


async def health_lease(lab: Lab) -> LeaseRef:
    """The claimed lease of the health task the pass just placed (the only one not ended)."""
    assert await lab.store.health_pass() == (1, 1)
    page = await lab.store.list_tasks(kind=TaskKind.HEALTH, limit=1000)
    (task_id,) = [t.task_id for t in page.tasks if t.status not in ENDED]
    (a,) = (await lab.store.get_task(task_id)).attempts
    lease = LeaseRef(host_id=a.host_id, task_id=task_id, attempt=a.attempt, lease_id=a.lease_id)
    await lab.store.claim(lease)
    return lease


async def test_the_third_infra_failure_commits_one_quarantine_event_and_an_undo_one_return(
    heard: tuple[Lab, list[Committed]],
) -> None:
    lab, _ = heard
    await lab.host("h1", "d1")
    assert device_events(await fail_infra(lab)) == []
    assert device_events(await fail_infra(lab)) == []
    third = await fail_infra(lab)
    assert len(third) == 1  # one transaction: the report and its device event
    (event,) = device_events(third)
    assert (event.event, event.device_id, event.host_id, event.by, event.infra_failures) == (
        DeviceEventKind.QUARANTINED, "d1", "h1", DeviceEventCause.INFRA_FAILURES, 3,
    )  # fmt: skip
    assert event.reason == "3 consecutive infrastructure failures (last: infra)"
    assert await device_rows(lab.store) == 1

    undo = await committed(lab, lab.store.drain_device("d1", False))
    (returned,) = device_events(undo)
    assert (returned.event, returned.by, returned.infra_failures, returned.reason) == (
        DeviceEventKind.RETURNED, DeviceEventCause.OPERATOR, 0, event.reason,
    )  # fmt: skip
    assert device_events(await committed(lab, lab.store.drain_device("d1", False))) == []  # not quarantined
    assert device_events(await committed(lab, lab.store.drain_device("d1", True))) == []  # a drain is no event
    assert await device_rows(lab.store) == 2


async def test_health_checks_quarantine_and_return_once(heard: tuple[Lab, list[Committed]]) -> None:
    lab, _ = heard
    await lab.store.set_health_check("adb", {}, CHECK, 600)
    await lab.host("h1", "d1")
    lease = await health_lease(lab)  # never checked: due at once
    assert device_events(await committed(lab, lab.store.report(lease, Outcome.DONE))) == []  # was in service

    lab.clock.advance(601)
    await lab.alive()
    lease = await health_lease(lab)
    failed = await committed(lab, lab.store.report(lease, Outcome.FAILED, reason="battery swollen"))
    (event,) = device_events(failed)
    assert (event.event, event.by, event.reason) == (
        DeviceEventKind.QUARANTINED, DeviceEventCause.HEALTH_CHECK, HEALTH_CHECK_FAILED,
    )  # fmt: skip

    lease = await health_lease(lab)  # quarantined: due again at once
    again = await committed(lab, lab.store.report(lease, Outcome.FAILED, reason="still swollen"))
    assert device_events(again) == []  # already quarantined

    lease = await health_lease(lab)
    (back,) = device_events(await committed(lab, lab.store.report(lease, Outcome.DONE)))
    assert (back.event, back.by, back.infra_failures) == (DeviceEventKind.RETURNED, DeviceEventCause.HEALTH_CHECK, 0)
    assert await device_rows(lab.store) == 2


async def test_a_host_undo_returns_only_its_quarantined_devices(heard: tuple[Lab, list[Committed]]) -> None:
    lab, _ = heard
    await lab.host("h1", "d1", "d2")
    for _ in range(3):
        await fail_infra(lab, "d1")
    undo = await committed(lab, lab.store.drain_host("h1", False))
    assert [(e.event, e.device_id, e.by) for e in device_events(undo)] == [
        (DeviceEventKind.RETURNED, "d1", DeviceEventCause.OPERATOR)
    ]


async def test_a_lease_expiry_that_quarantines_commits_the_event_with_the_sweep(
    heard: tuple[Lab, list[Committed]],
) -> None:
    lab, _ = heard
    await lab.host("h1", "d1")
    await fail_infra(lab)
    await fail_infra(lab)
    lease = await lab.running(device_id="d1", max_attempts=1)
    lab.clock.advance(31)
    await lab.alive()
    (sweep,) = await committed(lab, lab.store.sweep_expired())
    (event,) = device_events([sweep])
    assert (event.event, event.device_id, event.by, event.infra_failures) == (
        DeviceEventKind.QUARANTINED, "d1", DeviceEventCause.INFRA_FAILURES, 3,
    )  # fmt: skip
    assert lease.task_id  # the expired task's own events are in the same commit
    assert any(not isinstance(m.event, DeviceEvent) for m in sweep.messages)


async def test_the_relay_claims_device_events_and_leaves_kinds_it_does_not_know(lab: Lab) -> None:
    await lab.host("h1", "d1")
    for _ in range(3):
        await fail_infra(lab)
    got: list[OutboxMessage] = []

    async def publish(batch: Sequence[OutboxMessage]) -> Published:
        got.extend(batch)
        return Published([m.id for m in batch])

    async with lab.store.engine.connect() as conn, conn.begin() as tx:  # rolled back: a later release's row
        await conn.execute(text("ALTER TABLE outbox DROP CONSTRAINT ck_outbox_kind"))
        await conn.execute(
            text("INSERT INTO outbox (kind, data, headers, created_at) VALUES ('from_the_future', '{}', '{}', now())")
        )
        now = (await conn.execute(text("SELECT now()"))).scalar_one()
        outcome = await outbox_module.relay(conn, now, publish, 1000)
        assert outcome.error is None
        future = (await conn.execute(text("SELECT count(*) FROM outbox_unsent WHERE kind = 'from_the_future'"))).one()
        assert future.count == 1  # not claimed: left for a relay that knows it
        await tx.rollback()
    (event,) = [m.event for m in got if isinstance(m.event, DeviceEvent)]
    assert (event.event, event.device_id) == (DeviceEventKind.QUARANTINED, "d1")
