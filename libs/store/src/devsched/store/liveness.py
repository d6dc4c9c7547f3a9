"""Host liveness: any request of a registered host counts as a sign of life, whatever its answer."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
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

#: How long after a statement of this process that recorded a host's sign of life (`TOUCH`) a granted
#: request of that host leaves `TOUCH` out (`RecentSigns`).
RECENT_S = 0.25

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


class RecentSigns:
    """The hosts whose sign of life a statement of this process began recording within the last `RECENT_S`.

    `TOUCH` writes a host's row at most once a second, but as a CTE it costs every statement that carries
    it an UPDATE of the hosts table, written or not, on one row that every request of the host reads:
    about a fifth of Postgres's CPU per renewal, and the renewals of 8 devices of a host queued on its page
    (issue 10). A granted claim, renewal or report (`devsched.store.grants`) of a host for which a
    statement of this process began carrying it less than `RECENT_S` ago leaves it out (`signing`).

    The window opens when the touching statement begins, not when it commits: the requests of a host's
    other devices that arrive while it runs leave `TOUCH` out too. Carrying it, each would wait for the
    first one's row lock to re-check `last_seen_at` (a report holds it until its hand-over commits: 2.5 ms
    on average for a tenth of the reports at c=16). A statement that fails (or is cancelled) closes the
    window it opened, so the host's next request carries `TOUCH` again. The one that carried it left
    `last_seen_at` at most a second behind its clock, read when it ran, so the recorded sign of life lags a
    request by less than `1 s + RECENT_S`, well inside the 3 heartbeat intervals (at least 1.5 s) that
    make a host offline. A request the grant refuses goes on to the locked path, which always records it;
    so do heartbeats. Time is the store's clock when a test sets it (then every request at least
    `RECENT_S` after the last touching one carries `TOUCH`, which writes only a second apart: the rows are
    those of always touching), else this process's monotonic clock.
    """

    __slots__ = ("_at", "_clock")

    #: Hosts remembered before the ones not touched within `RECENT_S` are forgotten.
    KEPT = 4096

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._at: dict[str, float] = {}

    def _now(self) -> float:
        bound = self._clock.bound()
        return time.monotonic() if bound is None else bound.timestamp()

    @contextmanager
    def signing(self, host_id: str) -> Iterator[bool]:
        """Whether the statement run inside should carry `TOUCH` for `host_id`; if so, its window opens now.

        An exception out of the block (the statement failed, or was cancelled) closes that window again.
        """
        at = self._open(host_id)
        try:
            yield at is not None
        except BaseException:
            if at is not None and self._at.get(host_id) == at:
                del self._at[host_id]
            raise

    def _open(self, host_id: str) -> float | None:
        now = self._now()
        at = self._at.get(host_id)
        if at is not None and now - at < RECENT_S:
            return None
        if len(self._at) >= self.KEPT and at is None:
            self._at = {h: t for h, t in self._at.items() if now - t < RECENT_S}
        self._at[host_id] = now
        return now

    def __len__(self) -> int:
        """How many hosts it remembers."""
        return len(self._at)


@dataclass(frozen=True, slots=True)
class Rejected:
    """A conflict decided after liveness was recorded: the transaction commits, then this is raised."""

    error: DevschedError
