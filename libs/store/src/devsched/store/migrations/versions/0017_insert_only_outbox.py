"""Insert-only event history: publication is recorded apart from the event rows, per relay pass, not per row.

Until now each outbox row was written twice: inserted with its change, then rewritten by `UPDATE ... SET
sent_at` once published, a new version of the whole jsonb row and of each of its index entries (never
HOT: `ix_outbox_unsent` is partial on `sent_at`). Now an event row is never changed after its insert:

- `outbox.xid` is the id of the transaction that wrote the row (`pg_current_xact_id()`, its default, so
  every insert fills it, an older release's too), indexed by `ix_outbox_xid` instead of `ix_outbox_unsent`.
- `outbox_sent` holds one row per relay pass that published something: the ids it published (`ids`), the
  newest transaction among them (`top`), and the pass's `floor`, a transaction id below which every event
  row is published. Ids commit out of order, so the floor is not a high-water mark of ids: it is the least
  of the oldest transaction still running (`pg_snapshot_xmin`: every row of an older one is committed and
  visible, or never will be) and the oldest transaction among the rows still unpublished.
- `devsched_outbox_floor()` is the highest floor recorded, and `outbox_unsent` the one definition of an
  unpublished row: at or above the floor and in no pass's `ids` (only passes with `top` at or above the
  floor can hold one). Relay claims, gauges and tests all read it. The floor is a function, not a
  subquery, so that the planner sees its value and scans `ix_outbox_xid` from it; the view reads two
  relations so that it cannot be written through (a relay's claim locks rows through it, `SELECT ...
  FOR UPDATE`, which asks for UPDATE on the view: granting that must not grant rewriting an event).
- `devsched_prune` deletes a pruned task's rows only once published, as before, and removes the passes
  wholly below the floor (keeping the one that records it).

Rows published before the upgrade get transaction id 1, below every floor; rows still waiting get this
migration's own, at or above the first floor (the oldest transaction running now), which a writer blocked
behind this migration's lock is at or above too. The downgrade writes `sent_at` back (`now()` for every
published row: the passes record when they published, not each row) and its partial index.

During a rolling update an older release's relay can no longer mark rows sent (`sent_at` is gone), so its
pass over the table fails and is retried; what it publishes at once still goes out, and this release's
relay publishes every row from the table: upgrade the schedulers soon after migrating. Its inserts work.

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-07
"""

import importlib
from collections.abc import Sequence

from alembic import op

from devsched.store.migrations import execute_script

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

UPGRADE = """
ALTER TABLE outbox ADD COLUMN xid xid8 NOT NULL DEFAULT '1';

UPDATE outbox SET xid = pg_current_xact_id() WHERE sent_at IS NULL;

ALTER TABLE outbox ALTER COLUMN xid SET DEFAULT pg_current_xact_id();

CREATE INDEX ix_outbox_xid ON outbox (xid);

DROP INDEX ix_outbox_unsent;

ALTER TABLE outbox DROP COLUMN sent_at;

CREATE TABLE outbox_sent (
    seq bigserial PRIMARY KEY,
    ids bigint[] NOT NULL,
    top xid8 NOT NULL,
    floor xid8 NOT NULL,
    at timestamptz NOT NULL
);

CREATE INDEX ix_outbox_sent_top ON outbox_sent (top);

CREATE INDEX ix_outbox_sent_floor ON outbox_sent (floor);

INSERT INTO outbox_sent (ids, top, floor, at)
VALUES ('{}', '1', pg_snapshot_xmin(pg_current_snapshot()), now());

CREATE FUNCTION devsched_outbox_floor() RETURNS xid8 LANGUAGE sql STABLE AS $$
    SELECT coalesce(max(floor), '1'::xid8) FROM public.outbox_sent
$$;

REVOKE ALL ON FUNCTION devsched_outbox_floor() FROM PUBLIC;

CREATE VIEW outbox_unsent AS
SELECT o.id, o.kind, o.data, o.headers, o.created_at, o.xid
FROM outbox o, (SELECT devsched_outbox_floor() AS floor) f
WHERE o.xid >= f.floor
  AND NOT EXISTS (
      SELECT FROM outbox_sent s, unnest(s.ids) AS p(id) WHERE s.top >= devsched_outbox_floor() AND p.id = o.id
  )
"""

DOWNGRADE = """
ALTER TABLE outbox ADD COLUMN sent_at timestamptz;

UPDATE outbox o SET sent_at = now() WHERE NOT EXISTS (SELECT FROM outbox_unsent u WHERE u.id = o.id);

CREATE INDEX ix_outbox_unsent ON outbox (id) WHERE sent_at IS NULL;

DROP VIEW outbox_unsent;

DROP TABLE outbox_sent;

DROP FUNCTION devsched_outbox_floor();

ALTER TABLE outbox DROP COLUMN xid
"""

_PRUNE_0015: str = importlib.import_module(
    "devsched.store.migrations.versions.0015_reservations_are_attempts"
).CREATE_PRUNE
#: The lines of `devsched_prune` (migration 0006) that delete a pruned task's sent rows, and the check after
#: which nothing more is done when no task is pruned.
_SENT_ROWS = " AND sent_at IS NOT NULL;\n"
_NOTHING_TO_PRUNE = "    IF ids IS NULL THEN\n"
assert _PRUNE_0015.count(_SENT_ROWS) == 2
assert _NOTHING_TO_PRUNE in _PRUNE_0015
#: `devsched_prune` that deletes a pruned task's published rows (those not in `outbox_unsent`) and, at every
#: call, the relay passes wholly below the floor but those that record it.
CREATE_PRUNE = _PRUNE_0015.replace(
    _SENT_ROWS, "\n        AND NOT EXISTS (SELECT FROM public.outbox_unsent u WHERE u.id = outbox.id);\n"
).replace(
    _NOTHING_TO_PRUNE,
    "    DELETE FROM public.outbox_sent\n"
    "    WHERE top < public.devsched_outbox_floor() AND floor < public.devsched_outbox_floor();\n" + _NOTHING_TO_PRUNE,
    1,
)


def upgrade() -> None:
    """Add the rows' transaction ids, the passes' table, the floor and the unsent view; drop `sent_at`."""
    execute_script(UPGRADE)
    op.execute(CREATE_PRUNE)


def downgrade() -> None:
    """`sent_at` and its partial index again, from the passes; pruning as in 0015."""
    op.execute(_PRUNE_0015)
    execute_script(DOWNGRADE)
