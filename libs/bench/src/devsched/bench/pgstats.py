"""Postgres's own counters, read as the superuser: commits, transaction ids, and pg_stat_statements.

`pg_stat_database.xact_commit` counts every commit, read-only ones too, but a backend reports its counts
at most once a second while busy and within 10 s once idle: a phase's count is read after a settle, and
the idle system's commits over that settle (the services' periodic passes, heartbeats) are taken out.
The transaction-id counter (`pg_current_snapshot()`'s xmax) moves at once, by one per transaction that
wrote something: the commits that cost an fsync. The WAL insert position (`pg_current_wal_insert_lsn()`, the
whole cluster) also moves at once: its advance is the volume every write cost, a figure that CPU noise on a
shared machine does not move (`pg_stat_wal.wal_bytes` is reported like the commits, and a short phase read
before its backends reported could show none). Row versions (`tup_inserted + tup_updated`: every insert and
every update writes a new version of a row, HOT or not) are reported like the commits, and counted like them.
WAL syncs (`pg_stat_io`'s fsyncs of the WAL, Postgres 18; the whole cluster) are the fsyncs the commits cost,
reported like the commits too, the idle system's over the settle taken out.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any


@dataclass(frozen=True, slots=True)
class Counters:
    """A reading of one database's counters."""

    commits: int
    rollbacks: int
    next_xid: int
    wal_bytes: int
    """The cluster's WAL insert position, in bytes: WAL written so far."""
    row_versions: int
    """Rows inserted plus rows updated (each a new row version), as last reported."""
    wal_syncs: int
    """The cluster's fsyncs of the WAL, as last reported (0 before Postgres 18, which does not count them)."""
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
    row_versions: float = 0.0
    """Row versions written (inserts plus updates), the idle system's over the settle taken out."""
    wal_syncs: float = 0.0
    """fsyncs of the WAL (cluster-wide), the idle system's over the settle taken out."""

    def plus(self, other: Counted) -> Counted:
        """Both phases' counts together."""
        return Counted(
            self.commits + other.commits,
            self.write_transactions + other.write_transactions,
            self.wal_bytes + other.wal_bytes,
            self.row_versions + other.row_versions,
            self.wal_syncs + other.wal_syncs,
        )


def since(
    before: Counters, after: Counters, *, idle_commits: float = 0.0, idle_rows: float = 0.0, idle_syncs: float = 0.0
) -> Counted:
    """What happened between two readings, less what the idle system would have done meanwhile."""
    return Counted(
        max(0.0, after.commits - before.commits - idle_commits),
        after.next_xid - before.next_xid,
        after.wal_bytes - before.wal_bytes,
        max(0.0, after.row_versions - before.row_versions - idle_rows),
        max(0.0, after.wal_syncs - before.wal_syncs - idle_syncs),
    )


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
        #: Row versions per second of the idle system (heartbeats), per database.
        self.idle_row_rate: dict[str, float] = {}
        #: WAL fsyncs per second of the idle system (the whole cluster).
        self.idle_sync_rate = 0.0
        self._counts_syncs = True

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
            " pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0')::bigint AS wal,"
            " tup_inserted + tup_updated AS row_versions"
            " FROM pg_stat_database WHERE datname = $1",
            database,
        )
        return Counters(
            int(row["xact_commit"]),
            int(row["xact_rollback"]),
            int(row["xid"]),
            int(row["wal"]),
            int(row["row_versions"]),
            await self._wal_syncs(),
            time.monotonic(),
        )

    async def _wal_syncs(self) -> int:
        """The cluster's WAL fsyncs so far; 0 where `pg_stat_io` does not count them (before Postgres 18)."""
        if not self._counts_syncs:
            return 0
        try:
            value = await self._conn.fetchval(
                "SELECT coalesce(sum(fsyncs), 0)::bigint FROM pg_stat_io WHERE object = 'wal'"
            )
        except Exception:  # no such view or value: an older Postgres
            self._counts_syncs = False
            return 0
        return int(value)

    async def measure_idle(self, database: str, settle_s: float) -> float:
        """Commits per second of `database` while nothing but the services' own loops runs."""
        await asyncio.sleep(settle_s)  # what came before reports itself first
        first = await self.counters(database)
        await asyncio.sleep(settle_s)
        second = await self.counters(database)
        elapsed = second.at - first.at
        rate = max(0.0, (second.commits - first.commits) / elapsed)
        self.idle_commit_rate[database] = rate
        self.idle_row_rate[database] = max(0.0, (second.row_versions - first.row_versions) / elapsed)
        self.idle_sync_rate = max(0.0, (second.wal_syncs - first.wal_syncs) / elapsed)
        return rate

    async def settled(self, database: str, before: Counters, settle_s: float) -> tuple[Counted, Counters]:
        """Wait `settle_s`, read again; returns what happened since `before` and the new reading."""
        xid_now = (await self.counters(database)).next_xid  # xids move at once: read before the idle wait
        await asyncio.sleep(settle_s)
        after = await self.counters(database)
        counted = since(
            before,
            replace(after, next_xid=xid_now),
            idle_commits=self.idle_commit_rate.get(database, 0.0) * settle_s,
            idle_rows=self.idle_row_rate.get(database, 0.0) * settle_s,
            idle_syncs=self.idle_sync_rate * settle_s,
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


def between(before: list[Statement], after: list[Statement]) -> list[Statement]:
    """The statements run between two readings of `PgStats.statements` (no reset between), by total time."""
    earlier = {s.query: s for s in before}
    ran = []
    for s in after:
        e = earlier.get(s.query)
        calls = s.calls - (e.calls if e else 0)
        if calls > 0:
            ran.append(
                Statement(s.query, calls, s.total_ms - (e.total_ms if e else 0.0), s.rows - (e.rows if e else 0))
            )
    return sorted(ran, key=lambda s: s.total_ms, reverse=True)


def added(readings: Iterable[list[Statement]]) -> list[Statement]:
    """Several loads' statements (each from `between`) together, by total time."""
    sums: dict[str, Statement] = {}
    for statements in readings:
        for s in statements:
            t = sums.get(s.query)
            sums[s.query] = (
                s if t is None else Statement(s.query, t.calls + s.calls, t.total_ms + s.total_ms, t.rows + s.rows)
            )
    return sorted(sums.values(), key=lambda s: s.total_ms, reverse=True)


def commits_in(statements: list[Statement]) -> int:
    """Calls of COMMIT among `statements` (the explicit transactions' ends)."""
    return sum(s.calls for s in statements if s.query.strip().rstrip(";").upper() == "COMMIT")
