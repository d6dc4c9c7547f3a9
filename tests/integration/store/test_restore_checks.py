"""The database checks of the restore drill (deploy/README.md, `restore-checks.sql`) run on the real schema.

Each query must return no row on a sound database, and finds the task a broken one holds: the drill's
verdict is only as good as these queries, which a schema change could otherwise silently break.
"""

from __future__ import annotations

import re
from pathlib import Path

import asyncpg
import pytest

from support.invariants import plain_dsn
from support.store_lab import Lab

pytestmark = pytest.mark.integration

README = Path(__file__).resolve().parents[3] / "deploy" / "README.md"


def restore_checks() -> list[str]:
    """The statements of the README's `restore-checks.sql` block, in order."""
    blocks = re.findall(r"```sql\n(.*?)```", README.read_text(), flags=re.DOTALL)
    (block,) = [b for b in blocks if "-- restore-checks.sql" in b]
    lines = [re.sub(r"^\s+", "", line) for line in block.splitlines() if not line.strip().startswith("--")]
    return [s.strip() for s in " ".join(lines).split(";") if s.strip()]


async def _rows(database_url: str) -> list[list[asyncpg.Record]]:
    conn = await asyncpg.connect(plain_dsn(database_url))
    try:
        return [await conn.fetch(statement) for statement in restore_checks()]
    finally:
        await conn.close()


async def test_the_checks_pass_on_a_sound_database_and_find_a_broken_task(lab: Lab, database_url: str) -> None:
    assert len(restore_checks()) == 5
    await lab.host("h1", "d1")
    lease = await lab.running()
    await lab.submit()  # and one queued
    assert await _rows(database_url) == [[] for _ in restore_checks()]
    # A task in flight whose attempt ended: what a torn restore could hold.
    conn = await asyncpg.connect(plain_dsn(database_url))
    try:
        await conn.execute(
            "UPDATE attempts SET status = 'expired', end_reason = 'lease_expired', ended_at = now()"
            " WHERE task_id = $1 AND attempt = $2",
            lease.task_id,
            lease.attempt,
        )
    finally:
        await conn.close()
    found = await _rows(database_url)
    assert [row["task_id"] for row in found[3]] == [lease.task_id]
    assert found[:3] == [[], [], []]
