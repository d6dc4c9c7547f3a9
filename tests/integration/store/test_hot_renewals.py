"""A renewal is a heap-only (HOT) update: it writes no index entry (migration 0013).

Postgres counts HOT updates per table (`pg_stat_user_tables.n_tup_hot_upd`); the backends report their
counts when idle, so the test polls. An index on any column a renewal changes makes every renewal non-HOT,
and this test fails.
"""

from __future__ import annotations

import asyncpg
import pytest

from support.polling import eventually
from support.store_lab import Lab

pytestmark = pytest.mark.integration

RENEWALS = 20

_COUNTS = "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relname = 'attempts'"


async def test_renewals_and_claims_are_heap_only_updates(lab: Lab, database_url: str) -> None:
    conn = await asyncpg.connect(database_url.replace("postgresql+asyncpg://", "postgresql://", 1), timeout=10)
    try:
        await lab.host("h1", "d1")
        lease = await lab.assign_one(await lab.submit())

        async def counts() -> tuple[int, int]:
            row = await conn.fetchrow(_COUNTS)
            assert row is not None
            return int(row["n_tup_upd"]), int(row["n_tup_hot_upd"])

        updates, hot = await counts()
        await lab.store.claim(lease)
        for _ in range(RENEWALS):
            lab.clock.advance(1)
            assert await lab.store.renew(lease) is not None

        async def reported() -> tuple[int, int] | None:
            now = await counts()
            return now if now[0] >= updates + RENEWALS + 1 else None

        now_updates, now_hot = await eventually(reported, timeout=30, message="the renewals in pg_stat_user_tables")
        assert now_updates - updates == RENEWALS + 1, "the claim and each renewal update the attempt once"
        assert now_hot - hot == RENEWALS + 1, "none of them writes an index entry"
    finally:
        await conn.close()
