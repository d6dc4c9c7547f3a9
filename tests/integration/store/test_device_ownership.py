"""A device id belongs to the host that first registered it until an operator frees it; operator labels win.

Against a real database: the store's refusals, the database's own (the owner trigger, the labels check),
two hosts registering one new device id in real concurrent sessions, and the audit rows.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import sqlalchemy.exc
from sqlalchemy import text

from devsched.core.actions import action_labels
from devsched.core.errors import Conflict, DeviceConflict, NotFound
from devsched.core.status import Outcome
from devsched.store import ActionSpec, DeviceSpec, ManualClock, Store
from support.polling import eventually
from support.store_lab import Lab, snapshot

pytestmark = pytest.mark.integration


async def _owner(store: Store, device_id: str) -> str:
    async with store.engine.connect() as conn:
        owner = await conn.execute(text("SELECT host_id FROM devices WHERE device_id = :d"), {"d": device_id})
        return str(owner.scalar_one())


async def _audit(store: Store) -> list[tuple[str, str, str, str | None]]:
    async with store.engine.connect() as conn:
        rows = await conn.execute(text("SELECT device_id, action, actor, reason FROM device_audit ORDER BY id"))
        return [(r.device_id, r.action, r.actor, r.reason) for r in rows.all()]


async def test_an_idle_withdrawn_device_stays_its_hosts(lab: Lab) -> None:
    await lab.host("h1", "d1", "d2")
    await lab.store.register_host("h1", [])  # withdrawn (a drain, a shutdown): idle, listed nowhere
    before = await snapshot(lab.store)
    with pytest.raises(DeviceConflict) as err:
        await lab.store.register_host("h2", [DeviceSpec("d3"), DeviceSpec("d1", {"platform": "android"})])
    assert err.value.details == {"devices": {"d1": "h1"}}
    assert "d1" in str(err.value)
    assert await snapshot(lab.store) == before, "the refused registration changed nothing"
    await lab.host("h1", "d1", "d2")  # the owner comes back (a restart): its own devices again
    (host,) = await lab.store.list_hosts()
    assert [d.device_id for d in host.devices] == ["d1", "d2"]


async def test_a_task_pinned_to_a_device_goes_to_its_owner_only(lab: Lab) -> None:
    await lab.host("h1", "d1")
    await lab.store.register_host("h1", [])
    task = await lab.submit(device_id="d1")
    with pytest.raises(DeviceConflict):
        await lab.store.register_host("h2", [DeviceSpec("d1")])
    assert await lab.store.assign() == []
    await lab.host("h1", "d1")
    lease = await lab.assign_one(task)
    assert lease.host_id == "h1"


async def test_forget_frees_the_device_for_the_next_host_and_is_audited(lab: Lab) -> None:
    await lab.host("h1", "d1")
    lease = await lab.running(device_id="d1")
    with pytest.raises(Conflict, match="runs an attempt"):
        await lab.store.forget_device("d1", "moved to rack 2")
    await lab.store.report(lease, Outcome.DONE)
    with pytest.raises(NotFound):
        await lab.store.forget_device("nope", "typo")
    freed = await lab.store.forget_device("d1", "moved to rack 2")
    assert (freed.device_id, freed.host_id, freed.reason, freed.actor) == (
        "d1",
        "h1",
        "moved to rack 2",
        "operator-api",
    )
    assert await lab.store.forget_device("d1", "again") == freed, "forgetting it again answers the first act"
    assert await _audit(lab.store) == [("d1", "forget", "operator-api", "moved to rack 2")]
    (h1,) = await lab.store.list_hosts()
    assert h1.devices == (), "its former host no longer lists it, nor gets work on it"
    await lab.store.register_host("h2", [DeviceSpec("d1")])
    assert await _owner(lab.store, "d1") == "h2"
    with pytest.raises(DeviceConflict):
        await lab.store.register_host("h1", [DeviceSpec("d1")])


async def test_forget_waits_for_the_grace_after_an_expired_attempt(lab: Lab) -> None:
    await lab.host("h1", "d1")
    lease = await lab.running(device_id="d1")
    await lab.expire(lease)
    with pytest.raises(Conflict, match="grace"):
        await lab.store.forget_device("d1", "r")
    lab.clock.advance(31)
    await lab.store.forget_device("d1", "r")


async def test_operator_labels_win_over_the_hosts_and_survive_its_registrations(lab: Lab) -> None:
    await lab.store.register_host("h1", [DeviceSpec("d1", {"pool": "ci", "os": "14"})], actions=[ActionSpec("flash")])
    view = await lab.store.label_device("d1", {"pool": "release", "rack": "2"})
    assert dict(view.labels) == {"pool": "release", "os": "14", "rack": "2"}
    assert dict(view.operator_labels) == {"pool": "release", "rack": "2"}
    # the host asserts the pinned key again, and drops another: the operator's stay
    await lab.store.register_host("h1", [DeviceSpec("d1", {"pool": "ci"})], actions=[ActionSpec("flash")])
    (host,) = await lab.store.list_hosts()
    (d1,) = host.devices
    assert dict(d1.labels) == {"pool": "release", "rack": "2"}
    assert dict(d1.operator_labels) == {"pool": "release", "rack": "2"}
    # selectors match the effective labels, the reserved action labels included
    ci = await lab.submit(labels={"pool": "ci"})
    release = await lab.submit(labels={"pool": "release", "rack": "2", **action_labels(["flash"])})
    assert [m.task_id for m in await lab.store.assign()] == [release]
    assert (await lab.store.get_task(ci)).pending_reason is not None
    # unpinned, the key shows the host's value again
    view = await lab.store.label_device("d1", {}, ["pool"])
    assert dict(view.labels) == {"pool": "ci", "rack": "2"}
    assert dict(view.operator_labels) == {"rack": "2"}
    assert [a[:2] for a in await _audit(lab.store)] == [("d1", "label"), ("d1", "label")]
    with pytest.raises(NotFound):
        await lab.store.label_device("nope", {"a": "b"})


async def test_the_database_keeps_the_owner_and_the_operators_labels(lab: Lab) -> None:
    await lab.host("h1", "d1")
    await lab.host("h2", "d2")
    await lab.store.label_device("d1", {"pool": "release"})
    async with lab.store.engine.connect() as conn:
        with pytest.raises(sqlalchemy.exc.IntegrityError, match="belongs to its host"):
            await conn.execute(text("UPDATE devices SET host_id = 'h2' WHERE device_id = 'd1'"))
        await conn.rollback()
        with pytest.raises(sqlalchemy.exc.IntegrityError, match="ck_devices_operator_labels_win"):
            await conn.execute(text("""UPDATE devices SET labels = '{"pool": "ci"}' WHERE device_id = 'd1'"""))
        await conn.rollback()
    assert await _owner(lab.store, "d1") == "h1"


@pytest.fixture
async def two_stores(database_url: str, clock: ManualClock) -> AsyncIterator[tuple[Store, Store]]:
    a, b = (Store.connect(database_url, clock=clock, pool_size=2) for _ in range(2))
    yield a, b
    await asyncio.gather(a.close(), b.close())


async def test_two_hosts_registering_one_new_device_at_once_one_owns_it(
    lab: Lab, two_stores: tuple[Store, Store]
) -> None:
    """Both registrations wait behind an uncommitted row of the device, then race for it when it goes."""
    await lab.host("h0", "d0")
    a, b = two_stores
    for round_ in range(3):
        device = f"new{round_}"
        async with lab.store.engine.connect() as blocker:
            await blocker.execute(
                text("INSERT INTO devices (device_id, host_id, updated_at) VALUES (:d, 'h0', now())"), {"d": device}
            )
            racing = [
                asyncio.create_task(a.register_host("ha", [DeviceSpec(device, {"who": "a"})])),
                asyncio.create_task(b.register_host("hb", [DeviceSpec(device, {"who": "b"})])),
            ]

            async def both_wait() -> bool:
                async with lab.store.engine.connect() as conn:
                    waiting = await conn.execute(
                        text(
                            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                            " AND wait_event_type = 'Lock' AND query LIKE '%INSERT INTO devices%'"
                        )
                    )
                    return int(waiting.scalar_one()) >= 2

            await eventually(both_wait, timeout=10, message="both registrations wait on the device's row")
            await blocker.rollback()
        results = await asyncio.gather(*racing, return_exceptions=True)
        refused = [r for r in results if isinstance(r, DeviceConflict)]
        assert len(refused) == 1, results
        assert [r for r in results if isinstance(r, BaseException) and r not in refused] == []
        winner = "ha" if results[0] is not refused[0] else "hb"
        assert await _owner(lab.store, device) == winner
        async with lab.store.engine.connect() as conn:
            labels = await conn.execute(text("SELECT labels FROM devices WHERE device_id = :d"), {"d": device})
            assert labels.scalar_one() == {"who": winner[-1]}
