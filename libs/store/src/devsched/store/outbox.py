"""The transactional outbox: domain events written with the change that caused them, published after commit.

Nothing is published for a change that rolled back, and nothing committed is lost. The process that
committed a change may publish its rows at once (the Store hands them over after the commit, see
`Committed`) and record them published later, many in one transaction. The relay claims the unpublished
rows nobody is publishing with SKIP LOCKED, hands them to the publisher, and records the ones it
acknowledged. A crash anywhere in between publishes them again, and JetStream's duplicate window drops the
copies by message id.

The event rows are history, written once and never changed (migration 0017): publication is recorded
apart, one `outbox_sent` row per relay pass with the ids it published, instead of a rewrite of each
row (a new version of its jsonb and of every index entry, never HOT while an index covers `sent_at`), so a
pass costs one narrow row however many events it publishes. Finding what is unpublished cannot use a
high-water mark of ids (ids commit out of order: a smaller id may commit after a larger one was
published); the passes record a floor of transaction ids instead, the least of the oldest transaction
still running and the oldest one among the rows still unpublished, and `outbox_unsent` (the one
definition of "unpublished") looks only at rows at or above it. A narrow row per published event would
have cost as many row versions as the rewrites, and a queue table as many again for its deletes.

The rows hold `devsched.core.events` values (a `kind` and the value's JSON shape, `devsched.store.eventrows`),
never wire messages: subjects, message ids and encodings are the protocol's, decided by whoever publishes.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from devsched.core.events import DomainEvent
from devsched.store.eventrows import KINDS, event_of, row_of
from devsched.store.faults import point
from devsched.store.views import OutboxMessage

#: Trace headers (W3C traceparent) of the request being handled; stored with every event it causes so
#: the trace follows the task through the relay.
trace_headers: ContextVar[Mapping[str, str] | None] = ContextVar("devsched_outbox_trace_headers", default=None)


def current_trace() -> Mapping[str, str]:
    """The trace headers of the request being handled (empty outside a request)."""
    return trace_headers.get() or {}


# -- writing ---------------------------------------------------------------------------------------------

#: Rows go in, in the order given (so the ids the sequence hands out ascend in that order).
_INSERT = """
    INSERT INTO outbox (kind, data, headers, created_at)
    SELECT k, d::jsonb, h::jsonb, :now
    FROM unnest(CAST(:kinds AS text[]), CAST(:data AS text[]), CAST(:headers AS text[])) WITH ORDINALITY
         AS u(k, d, h, n)
    ORDER BY n
"""
_INSERT_QUIETLY = text(_INSERT)
_INSERT_RETURNING = text(_INSERT + " RETURNING id")


def event_row(event: DomainEvent, trace: Mapping[str, str] | None = None) -> tuple[str, str, str]:
    """`(kind, data, headers)` of `event` as JSON text, as `Outbox.add` queues them.

    For a statement that inserts its event row itself (`devsched.store.inline`); `trace` as in `add`.
    """
    kind, data = row_of(event)
    headers = current_trace() if trace is None else trace
    return kind, json.dumps(data), json.dumps(dict(headers)) if headers else "{}"


def inserted(rows: str | None) -> list[OutboxMessage]:
    """The messages a statement inserted itself, from its `devsched.store.inline.INSERTED` column."""
    if not rows:
        return []
    return [
        OutboxMessage(id=r["id"], event=event_of(r["kind"], r["data"]), headers=r["headers"]) for r in json.loads(rows)
    ]


class Outbox:
    """Collects the domain events of one transaction and writes them in one statement.

    Args:
        defer: `flush` only notes the time, and the owner of the transaction calls `write` at its end: an
            operation made of several (a submit that also assigns) then writes all its events at once.
        returning: read back the ids of the rows written (`written`), for a publisher that publishes
            them right after the commit (the sweeper's role may insert rows but not read them).
    """

    def __init__(self, *, defer: bool = False, returning: bool = False) -> None:
        self._defer = defer
        self._returning = returning
        self._rows: list[tuple[str, str, str]] = []
        self._pending: list[tuple[DomainEvent, Mapping[str, str]]] = []
        self._now: datetime | None = None
        #: The messages written so far, with their ids (when `returning`).
        self.written: list[OutboxMessage] = []

    @property
    def returning(self) -> bool:
        """Whether the ids of the rows written are read back (`written`)."""
        return self._returning

    def took(self, messages: Sequence[OutboxMessage]) -> None:
        """Count in `written` the messages a statement of the transaction inserted itself (`inserted`)."""
        self.written += messages

    def add(self, event: DomainEvent, *, trace: Mapping[str, str] | None = None) -> None:
        """Queue `event` with its trace context.

        `trace` is the task's own trace context, for events no request caused (assignment, expiry); by
        default the current request's.
        """
        headers = dict(current_trace() if trace is None else trace)
        self._rows.append(event_row(event, headers))
        self._pending.append((event, headers))

    async def flush(self, conn: AsyncConnection, now: datetime) -> None:
        """Write the queued events in the caller's transaction (a deferring outbox writes them in `write`)."""
        self._now = now if self._now is None else max(self._now, now)
        if not self._defer:
            await self.write(conn, now)

    async def write(self, conn: AsyncConnection, now: datetime) -> None:
        """Write the queued events now, stamped with the latest time given to `flush` (else `now`)."""
        if not self._rows:
            return
        kinds, data, headers = (list(col) for col in zip(*self._rows, strict=True))
        params = {"kinds": kinds, "data": data, "headers": headers, "now": self._now or now}
        if self._returning:
            ids = sorted((await conn.execute(_INSERT_RETURNING, params)).scalars())
            self.written += [
                OutboxMessage(id=i, event=e, headers=h) for i, (e, h) in zip(ids, self._pending, strict=True)
            ]
        else:
            await conn.execute(_INSERT_QUIETLY, params)
        self._rows.clear()
        self._pending.clear()


# -- relaying ----------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Published:
    """What a publisher did with a claimed batch.

    `ids` are the messages whose publication was acknowledged, in any order (a publisher may have several
    in flight); `error` is what stopped it, if anything. Messages not in `ids` stay unsent.
    """

    ids: Sequence[int]
    error: Exception | None = None


#: Publishes a batch of claimed messages and says which were acknowledged; must not raise (see `Published`).
PublishBatch = Callable[[Sequence[OutboxMessage]], Awaitable[Published]]

#: Claims what nobody is publishing: unpublished, of a kind this release knows (`KINDS`), not the caller's
#: own (in flight or published at once), and (on a routine pass) old enough that whoever wrote it would have
#: published it and recorded that by now.
_CLAIM = text(
    """
    SELECT id, kind, data, headers FROM outbox_unsent
    WHERE kind = ANY(CAST(:kinds AS text[])) AND NOT (id = ANY(CAST(:skip AS bigint[])))
      AND (CAST(:before AS timestamptz) IS NULL OR created_at <= :before)
    ORDER BY id LIMIT :limit FOR UPDATE SKIP LOCKED
    """
)
#: Records one pass's publications: the ids, the newest transaction among them, and the floor of
#: transaction ids below which every event row is now published (see the module's docstring).
_SENT = text(
    """
    INSERT INTO outbox_sent (ids, top, floor, at)
    SELECT p.ids,
           coalesce((SELECT max(o.xid) FROM outbox o WHERE o.id = ANY(p.ids)), '1'),
           LEAST(pg_snapshot_xmin(pg_current_snapshot()),
                 (SELECT min(u.xid) FROM outbox_unsent u WHERE NOT (u.id = ANY(p.ids)))),
           :now
    FROM (SELECT CAST(:ids AS bigint[]) AS ids) p
    """
)


async def relay(
    conn: AsyncConnection,
    now: datetime,
    publish: PublishBatch,
    limit: int,
    *,
    mark: Sequence[int] = (),
    skip: Sequence[int] = (),
    before: datetime | None = None,
) -> Published:
    """Claim up to `limit` unpublished messages in id order, publish them; record those acked and `mark` sent.

    `mark` are messages the caller published already; `skip` those it is publishing now; `before`, if
    given, leaves alone messages created after it (their writer is still publishing them). The claimed
    rows stay locked until the caller's transaction ends, so no other relay publishes them meanwhile. The
    publisher's error is returned rather than raised, so that the record of the messages it did publish
    commits (the rest are tried again by the next pass). One `outbox_sent` row records them all.

    Raises:
        ValueError: the publisher acknowledged a message it was not given.
    """
    params = {"skip": sorted({*mark, *skip}), "before": before, "limit": limit, "kinds": list(KINDS)}
    rows = (await conn.execute(_CLAIM, params)).all()
    outcome = Published(())
    if rows:
        batch = [OutboxMessage(id=r.id, event=event_of(r.kind, r.data), headers=r.headers) for r in rows]
        outcome = await publish(batch)
        point("relay.after_publish")
        stray = set(outcome.ids) - {m.id for m in batch}
        if stray:
            raise ValueError(f"acknowledged outbox messages that were not claimed: {sorted(stray)}")
    sent = sorted({*mark, *outcome.ids})
    if sent:
        await conn.execute(_SENT, {"ids": sent, "now": now})
    return outcome


async def unsent_count(conn: AsyncConnection) -> int:
    """How many messages wait to be published (for metrics and tests)."""
    return int((await conn.execute(text("SELECT count(*) FROM outbox_unsent"))).scalar_one())
