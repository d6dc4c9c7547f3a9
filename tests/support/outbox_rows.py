"""SQL that rewrites what the outbox records as published (migration 0017), for tests that stage a relay's past.

The event rows never change; publication is `outbox_sent`, and `outbox_unsent` is what is not published.
"""

from __future__ import annotations

from collections.abc import Sequence

from devsched.store import OutboxMessage, Published

#: Forget every publication: every event row is unpublished again, as a relay that died before recording
#: its passes leaves them.
FORGET_PUBLISHED = "DELETE FROM outbox_sent"

#: Record every event row published, as one pass would.
ALL_PUBLISHED = (
    "INSERT INTO outbox_sent (ids, top, floor, at)"
    " SELECT coalesce(array_agg(id), '{}'), coalesce(max(xid), '1'), pg_snapshot_xmin(pg_current_snapshot()), now()"
    " FROM outbox_unsent"
)

#: Record every event row published but the one with the least id.
ALL_BUT_THE_FIRST_PUBLISHED = (
    "WITH forgotten AS (DELETE FROM outbox_sent)"
    " INSERT INTO outbox_sent (ids, top, floor, at)"
    " SELECT coalesce(array_agg(id), '{}'), coalesce(max(xid), '1'), '1', now()"
    " FROM outbox WHERE id > (SELECT min(id) FROM outbox)"
)


class Publisher:
    """A relay's publisher that acknowledges everything and remembers what it was given."""

    def __init__(self) -> None:
        self.got: list[OutboxMessage] = []

    async def __call__(self, batch: Sequence[OutboxMessage]) -> Published:
        self.got.extend(batch)
        return Published([m.id for m in batch])
