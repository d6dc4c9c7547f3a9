"""Postgres's own counters, read as the superuser: commits, transaction ids, and pg_stat_statements.

`pg_stat_database.xact_commit` counts every commit, read-only ones too, but a backend reports its counts
at most once a second while busy and within 10 s once idle: a phase's count is read after a settle, and
the idle system's commits over that settle (the services' periodic passes, heartbeats) are taken out.
The transaction-id counter (`pg_current_snapshot()`'s xmax) moves at once, by one per transaction that
wrote something: the commits that cost an fsync. The WAL insert position (`pg_current_wal_insert_lsn()`, the
whole cluster) also moves at once: its advance is the volume every write cost, a figure that CPU noise on a
shared machine does not move (`pg_stat_wal.wal_bytes` is reported like the commits, and a short phase read
before its backends reported could show none).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Counters:
    """A reading of one database's counters."""

    commits: int
    rollbacks: int
    next_xid: int
    wal_bytes: int
    """The cluster's WAL insert position, in bytes: WAL written so far."""
    at: float
    """`time.monotonic()` of the reading."""


@dataclass(frozen=True, slots=True)
class Counted:
    """What a phase cost the database."""

    commits: float
    """Commits (xact_commit), idle commits over the settle taken out."""
    write_transactions: int
    """Transaction ids assigned (cluster-wide): transactions that wrote."""
    wal_bytes: int
    """WAL written (cluster-wide, the idle loops' few bytes included: an estimate of those from an idle
    window swings with autovacuum and checkpoints, and taking it out could leave nothing)."""


@dataclass(frozen=True, slots=True)
class Statement:
    """One normalized statement of pg_stat_statements."""

    query: str
    calls: int
    total_ms: float
    rows: int

    def as_dict(self) -> dict[str, Any]:
        """For the JSON output."""
        return {"query": self.query, "calls": self.calls, "total_ms": round(self.total_ms, 3), "rows": self.rows}


class PgStats:
    """A superuser connection to the `postgres` database that reads the counters of the others."""

    def __init__(self, admin_dsn: str) -> None:
        self._dsn = admin_dsn
        self._conn: Any = None
        #: Commits per second of the idle system (set by `measure_idle`), per database.
        self.idle_commit_rate: dict[str, float] = {}

    async def open(self) -> None:
        """Connect."""
        import asyncpg  # type: ignore[import-untyped]

        self._conn = await asyncpg.connect(self._dsn, timeout=15)

    async def close(self) -> None:
        """Disconnect."""
        if self._conn is not None:
            await self._conn.close()
            self._conn = None

    async def counters(self, database: str) -> Counters:
        """The counters of `database` now (as last reported by its backends)."""
        row = await self._conn.fetchrow(
            "SELECT xact_commit, xact_rollback, pg_snapshot_xmax(pg_current_snapshot())::text::bigint AS xid,"
            " pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0')::bigint AS wal"
            " FROM pg_stat_database WHERE datname = $1",
            database,
        )
        return Counters(
            int(row["xact_commit"]), int(row["xact_rollback"]), int(row["xid"]), int(row["wal"]), time.monotonic()
        )

    async def measure_idle(self, database: str, settle_s: float) -> float:
        """Commits per second of `database` while nothing but the services' own loops runs."""
        await asyncio.sleep(settle_s)  # what came before reports itself first
        first = await self.counters(database)
        await asyncio.sleep(settle_s)
        second = await self.counters(database)
        rate = max(0.0, (second.commits - first.commits) / (second.at - first.at))
        self.idle_commit_rate[database] = rate
        return rate

    async def settled(self, database: str, before: Counters, settle_s: float) -> tuple[Counted, Counters]:
        """Wait `settle_s`, read again; returns what happened since `before` and the new reading."""
        xid_now = (await self.counters(database)).next_xid  # xids move at once: read before the idle wait
        await asyncio.sleep(settle_s)
        after = await self.counters(database)
        idle = self.idle_commit_rate.get(database, 0.0) * settle_s
        counted = Counted(
            max(0.0, after.commits - before.commits - idle),
            xid_now - before.next_xid,
            after.wal_bytes - before.wal_bytes,
        )
        return counted, after

    async def reset_statements(self) -> None:
        """Forget every statement's counts (all databases)."""
        await self._conn.execute("SELECT pg_stat_statements_reset()")

    async def statements(self, database: str) -> list[Statement]:
        """The statements run in `database` since the last reset, by total time."""
        rows = await self._conn.fetch(
            "SELECT query, sum(calls)::bigint AS calls, sum(total_exec_time) AS total_ms, sum(rows)::bigint AS rows"
            " FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid"
            " WHERE d.datname = $1 GROUP BY query ORDER BY 3 DESC",
            database,
        )
        return [Statement(r["query"], int(r["calls"]), float(r["total_ms"]), int(r["rows"])) for r in rows]

    async def show(self, *names: str) -> dict[str, str]:
        """The values of server settings."""
        return {name: str(await self._conn.fetchval(f"SHOW {name}")) for name in names}

    async def version(self) -> str:
        """`server_version`."""
        return str(await self._conn.fetchval("SHOW server_version"))


def commits_in(statements: list[Statement]) -> int:
    """Calls of COMMIT among `statements` (the explicit transactions' ends)."""
    return sum(s.calls for s in statements if s.query.strip().rstrip(";").upper() == "COMMIT")
