"""The outbox's rows are history: written once, never rewritten when published (migration 0017).

A published event used to cost a second version of its row (`UPDATE outbox SET sent_at`, never HOT). Now a
relay pass records what it published in one narrow `outbox_sent` row, whatever the count. Two proofs: an
event row keeps its physical place and its inserting transaction through every pass (`ctid`, `xmin`), and
Postgres's own counters (`pg_stat_user_tables`) show no update of `outbox` and one insert per pass over a
run of whole task lifecycles; the counts per task are printed (`-s`) for comparison.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import asyncpg
import pytest
from sqlalchemy import text

from devsched.core.events import AttemptAssigned
from devsched.core.status import Outcome
from devsched.store import Committed
from support.outbox_rows import Publisher
from support.polling import eventually
from support.store_lab import Lab, ref

pytestmark = pytest.mark.integration

#: Each row's physical place and inserting transaction: an UPDATE, HOT or not, changes both.
_VERSIONS = text("SELECT id, ctid::text AS place, xmin::text AS made_by FROM outbox ORDER BY id")
#: A copy of the first event under another seq: an event row a slow transaction writes.
_LATE_COPY = """
    INSERT INTO outbox (kind, data, headers, created_at)
    SELECT kind, jsonb_set(data, '{seq}', '99'), headers, created_at FROM outbox ORDER BY id LIMIT 1
"""
_FLOOR = "SELECT devsched_outbox_floor()::text"
#: Passes that can hold no unpublished row and do not record the floor.
_BELOW_THE_FLOOR = (
    "SELECT count(*) FROM outbox_sent WHERE top < devsched_outbox_floor() AND floor < devsched_outbox_floor()"
)
_COUNTS = "SELECT relname, n_tup_ins, n_tup_upd, n_tup_hot_upd, n_tup_del FROM pg_stat_user_tables"
_OTHERS = "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"


async def versions(lab: Lab) -> dict[int, tuple[str, str]]:
    async with lab.store.engine.connect() as conn:
        return {r.id: (r.place, r.made_by) for r in (await conn.execute(_VERSIONS)).all()}


async def test_publishing_never_writes_a_new_version_of_an_event_row(lab: Lab) -> None:
    heard: list[Committed] = []
    lab.store.on_commit = heard.append
    await lab.host("h1", "d1", "d2", "d3")
    for _ in range(3):
        await lab.submit()
    await lab.store.assign()
    before = await versions(lab)
    assert len(before) == 3 + 3 * 2, "three submitted events, then an assigned event and a message each"

    at_once = [m.id for m in heard[0].messages]  # the first submit's, as its process published them
    publisher = Publisher()
    assert await lab.store.relay_outbox(publisher, mark=at_once) == len(before) - len(at_once)
    assert await lab.store.unsent_count() == 0
    assert await lab.store.relay_outbox(publisher) == 0, "nothing is published twice"
    assert await versions(lab) == before, "every event row is the version its transaction inserted"


async def one(lab: Lab, sql: str) -> Any:
    async with lab.store.engine.connect() as conn:
        return (await conn.execute(text(sql))).scalar_one()


async def test_an_event_committed_after_a_later_one_was_published_is_still_published(lab: Lab) -> None:
    """Ids commit out of order: a row with a smaller id, committed after a larger one was published and
    recorded, is not below the floor (a high-water mark of ids would lose it)."""
    await lab.host("h1", "d1")
    await lab.submit()
    publisher = Publisher()
    async with lab.store.engine.connect() as slow:
        await slow.execute(text(_LATE_COPY))  # drawn its id, not committed
        (late,) = (await slow.execute(text("SELECT max(id) FROM outbox"))).scalars()
        await lab.submit()
        assert await lab.store.relay_outbox(publisher) == 2
        assert late not in [m.id for m in publisher.got]
        await slow.commit()
    assert await lab.store.unsent_count() == 1
    assert await lab.store.relay_outbox(publisher) == 1
    assert publisher.got[-1].id == late
    assert await lab.store.unsent_count() == 0


async def test_pruning_removes_the_passes_below_the_floor_and_keeps_the_floor(lab: Lab) -> None:
    await lab.host("h1", "d1")
    publisher = Publisher()
    for _ in range(4):
        await lab.submit()
        assert await lab.store.relay_outbox(publisher) == 1
    floor = await one(lab, _FLOOR)
    assert await one(lab, "SELECT count(*) FROM outbox_sent") >= 4
    assert await one(lab, _BELOW_THE_FLOOR) >= 1  # the migration's first record, at least
    assert await lab.store.prune(timedelta(hours=1)) == 0  # no task is old enough; the passes go anyway
    assert await one(lab, _FLOOR) == floor
    assert await one(lab, _BELOW_THE_FLOOR) == 0
    assert await one(lab, "SELECT count(*) FROM outbox_sent") >= 1, "the pass that records the floor stays"
    assert await lab.store.unsent_count() == 0
    assert await lab.store.relay_outbox(publisher) == 0, "what the removed passes recorded stays published"


async def test_a_task_lifecycle_updates_no_event_row_and_records_each_pass_once(
    inline: tuple[Lab, list[Committed]], database_url: str
) -> None:
    lab, heard = inline
    tasks, per_pass = 24, 8
    await lab.host("h1", "d1")
    publisher = Publisher()
    stats = await asyncpg.connect(database_url.replace("postgresql+asyncpg://", "postgresql://", 1), timeout=10)
    try:
        before = await settled(lab, stats)
        passes = 0
        for n in range(1, tasks + 1):
            await lab.submit()
            (assigned,) = [m.event for m in heard[-1].messages if isinstance(m.event, AttemptAssigned)]
            lease = ref(assigned)
            await lab.store.claim(lease)
            await lab.store.report(lease, Outcome.DONE, reason="ok")
            if n % per_pass == 0:  # what the relay does: one pass records what was published at once
                mark = [m.id for c in heard for m in c.messages]
                heard.clear()
                assert await lab.store.relay_outbox(publisher, mark=mark) == 0
                passes += 1
        after = await settled(lab, stats)
    finally:
        await stats.close()

    cost = {t: tuple(a - b for a, b in zip(after[t], before.get(t, (0, 0, 0, 0)), strict=True)) for t in after}
    cost = {t: c for t, c in cost.items() if any(c)}
    print(f"\nrow versions per task over {tasks} tasks (inserts, updates, of which HOT, deletes):")
    for table, (ins, upd, hot, dele) in sorted(cost.items()):
        print(f"  {table:<14} {ins / tasks:5.2f} {upd / tasks:5.2f} {hot / tasks:5.2f} {dele / tasks:5.2f}")
    total = sum(ins + upd + dele for ins, upd, _, dele in cost.values())
    print(f"  total          {total / tasks:5.2f}")
    assert cost["outbox"][0] >= 3 * tasks, "submitted, dispatched and done at least, per task"
    assert cost["outbox"][1] == 0, "no event row is rewritten"
    assert cost["outbox_sent"] == (passes, 0, 0, 0), "one narrow row per pass"


async def settled(lab: Lab, stats: asyncpg.Connection) -> dict[str, tuple[int, int, int, int]]:
    """The counters once the store's connections reported theirs: a backend flushes them as it ends, so the
    store's pool is emptied, and the counters read until they stop moving."""
    await lab.store.engine.dispose()
    previous: dict[str, tuple[int, int, int, int]] = {}

    async def steady() -> dict[str, tuple[int, int, int, int]] | None:
        nonlocal previous
        if await stats.fetchval(_OTHERS):
            return None
        rows = await stats.fetch(_COUNTS)
        now = {r["relname"]: (r["n_tup_ins"], r["n_tup_upd"], r["n_tup_hot_upd"], r["n_tup_del"]) for r in rows}
        same, previous = now == previous, now
        return now if same else None

    return await eventually(steady, timeout=30, interval=0.5, message="pg_stat_user_tables settled")
