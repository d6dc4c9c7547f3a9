"""The rows the store's statements fill in themselves are the rows the outbox writes for the same events.

Submit, placement, claim, progress, report, the hand-over to the reporting host, cancellation, the sweep
and the health pass each insert their events with SQL that fills in what only the statement knows; each
row must read back as a domain event whose row, written by the outbox, is the same JSON (the same keys,
the same time format), so what the relay publishes is the same whichever way the row was written.
"""

from __future__ import annotations

import json

import pytest
from sqlalchemy import text

from devsched.core.events import AttemptAssigned, DeviceEvent, TaskEvent
from devsched.core.records import LeaseRef
from devsched.core.status import Outcome
from devsched.store import Committed
from devsched.store.outbox import event_row, inserted
from support.store_lab import Lab, ref

pytestmark = pytest.mark.integration

PLAN = {"steps": [{"name": "flash", "action": "noop", "args": {}}, {"name": "boot", "action": "noop", "args": {}}]}


async def _stored(lab: Lab) -> list[tuple[str, dict[str, object]]]:
    async with lab.store.engine.connect() as conn:
        rows = (await conn.execute(text("SELECT id, kind, data, headers FROM outbox ORDER BY id"))).all()
    return [(r.kind, r.data) for r in rows]


async def test_every_row_a_statement_fills_in_is_the_row_the_outbox_writes(
    inline: tuple[Lab, list[Committed]],
) -> None:
    lab, heard = inline
    await lab.host("h1", "d1")
    first = await lab.submit(plan=PLAN, max_attempts=2)  # submit and placement, one statement each
    (assigned,) = [m.event for c in heard for m in c.messages if isinstance(m.event, AttemptAssigned)]
    lease = ref(assigned)
    await lab.store.claim(lease, progress={"step": "flash", "index": 0, "of": 2})  # dispatched and progress
    await lab.store.renew(lease, progress={"step": "boot", "index": 1, "of": 2})  # progress
    await lab.submit(plan=PLAN)  # waits for d1
    receipt = await lab.store.report(lease, Outcome.DONE, reason="fine", take_next=True)  # done, handed over
    assert receipt.next is not None
    handed = LeaseRef("h1", receipt.next.task_id, receipt.next.attempt, receipt.next.lease_id)
    await lab.store.request_cancel(handed.task_id, reason="stop it")  # cancel_requested
    await lab.expire(handed)  # the sweep: cancelled
    await lab.host("h2", "d2")  # d1 waits out its grace
    third = await lab.submit(plan=PLAN, max_attempts=2)
    (again,) = [m.event for m in heard[-1].messages if isinstance(m.event, AttemptAssigned)]
    await lab.expire(ref(again))  # the sweep: requeued
    await lab.store.set_health_check("adb", {"platform": "android"}, PLAN, 3600)
    await lab.store.health_pass()  # a health task submitted by the pass's statement
    assert first != third

    stored = await _stored(lab)
    kinds = {data.get("kind", kind) for kind, data in stored}
    assert {"submitted", "assigned", "assignment", "dispatched", "progress", "done", "cancel_requested"} <= kinds
    assert {"cancelled", "requeued"} <= kinds
    for kind, data in stored:
        (message,) = inserted(json.dumps([{"id": 1, "kind": kind, "data": data, "headers": {}}]))
        assert isinstance(message.event, TaskEvent | AttemptAssigned | DeviceEvent)
        _, written, _ = event_row(message.event, {})
        assert json.loads(written) == data, f"a {kind} row as the outbox writes it"
