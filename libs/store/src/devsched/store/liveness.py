"""Host liveness: any request of a registered host counts as a sign of life, whatever its answer."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from devsched.core.errors import DevschedError, NotFound
from devsched.store.clock import CLOCK_PARAM, NOW, Clock
from devsched.store.driver import Driver, Sql

#: Heartbeats a host may miss before it counts as offline (ARCHITECTURE.md: "3 missed make a host offline").
MISSED_HEARTBEATS = 3


def host_online(hosts: str = "h", now: str = "CAST(:now AS timestamptz)") -> str:
    """The one SQL condition "the host is online" at `now` (`:now`), for the `hosts` row aliased `hosts`.

    Every query that needs it (assignment, the host and device views, pending reasons) takes it from here,
    so the rule cannot drift between them.
    """
    return f"{hosts}.last_seen_at > {now} - make_interval(secs => {MISSED_HEARTBEATS} * {hosts}.heartbeat_interval_s)"


#: Liveness is written at most once a second per host: renewals of many devices of one host would
#: otherwise all queue on the host row. An UPDATE for statements that read the clock inline (`NOW`) and
#: need the host as `:host_id`; as a CTE its row lock comes first (see `devsched.store.grants`).
TOUCH = f"""
    UPDATE hosts SET last_seen_at = {NOW}
    WHERE host_id = :host_id AND last_seen_at < {NOW} - interval '1 second'
"""

_TOUCH = text(
    f"""
    WITH touched AS ({TOUCH})
    SELECT 1 FROM hosts WHERE host_id = :host_id
    """
)


_HEARTBEAT = Sql(_TOUCH)


async def heartbeat(db: Driver, clock: Clock, host_id: str) -> None:
    """Record a sign of life of `host_id`, in one statement of its own (`Transactor.statements`).

    Raises:
        NotFound: the host never registered.
    """
    if await db.row(_HEARTBEAT, {"host_id": host_id, CLOCK_PARAM: clock.bound()}) is None:
        raise NotFound(f"host {host_id} is not registered; register first", host_id=host_id)


async def touch_host(conn: AsyncConnection, host_id: str, now: datetime | None) -> None:
    """Record a sign of life of `host_id` at `now` (None: the database clock).

    Raises:
        NotFound: the host never registered.
    """
    if (await conn.execute(_TOUCH, {"host_id": host_id, CLOCK_PARAM: now})).first() is None:
        raise NotFound(f"host {host_id} is not registered; register first", host_id=host_id)


@dataclass(frozen=True, slots=True)
class Rejected:
    """A conflict decided after liveness was recorded: the transaction commits, then this is raised."""

    error: DevschedError
