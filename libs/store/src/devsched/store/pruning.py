"""Pruning ended history: one call of the database's `devsched_prune` per batch (migration 0006).

The rule (devsched.core.retention) is applied inside the database, by a function the sweeper may execute
but cannot change: the sweeper's role has no DELETE on any table.
"""

from __future__ import annotations

from datetime import timedelta

from devsched.core.retention import PRUNE_BATCH_MAX, check_retention
from devsched.store.driver import Driver, Sql

_PRUNE = Sql("SELECT devsched_prune(CAST(:keep AS interval), CAST(:lim AS integer)) AS pruned")


async def prune(db: Driver, keep: timedelta, limit: int) -> int:
    """Remove up to `limit` tasks that ended more than `keep` ago, with all that is theirs; how many."""
    if not 1 <= limit <= PRUNE_BATCH_MAX:
        raise ValueError(f"prune batch {limit} is outside 1..{PRUNE_BATCH_MAX}")
    row = await db.row(_PRUNE, {"keep": check_retention(keep), "lim": limit})
    return int(row["pruned"]) if row is not None else 0
