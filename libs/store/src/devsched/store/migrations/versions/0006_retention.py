"""Retention: `devsched_prune(keep, lim)`, the one way a service deletes, and only what has ended.

The function removes up to `lim` ended tasks (`done`, `failed`, `cancelled`) that were created and last
changed more than `keep` ago, with their attempts, reservations, cancellation requests and sent outbox
rows, in one call (devsched.core.retention states the rule). Tasks are taken with SKIP LOCKED, so
several sweepers prune side by side. It runs as its owner (SECURITY DEFINER, a fixed search_path): the
sweeper is granted EXECUTE on it and no DELETE on any table, so it can prune old history and nothing else;
a `keep` under an hour is refused. The outbox rows of a task are found through the unique indexes of
migration 0004; an unsent row is left for the relay.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-02
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

CREATE_FUNCTION = """
CREATE FUNCTION devsched_prune(keep interval, lim integer) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    cutoff timestamptz := now() - keep;
    ids uuid[];
    names text[];
    pruned integer;
BEGIN
    IF keep IS NULL OR keep < interval '1 hour' THEN
        RAISE EXCEPTION 'retention % is shorter than the least allowed, 1 hour', keep USING ERRCODE = '22023';
    END IF;
    IF lim IS NULL OR lim < 1 OR lim > 10000 THEN
        RAISE EXCEPTION 'prune batch % is outside 1..10000', lim USING ERRCODE = '22023';
    END IF;
    SELECT array_agg(v.task_id), array_agg(v.task_id::text) INTO ids, names FROM (
        SELECT task_id FROM public.tasks
        WHERE status IN ('done', 'failed', 'cancelled') AND created_at < cutoff AND updated_at < cutoff
        ORDER BY created_at
        LIMIT lim
        FOR UPDATE SKIP LOCKED
    ) v;
    IF ids IS NULL THEN
        RETURN 0;
    END IF;
    -- each kind through its own unique index (migration 0004); an unsent row is left for the relay
    DELETE FROM public.outbox WHERE kind = 'task_event' AND (data->>'task_id') = ANY(names) AND sent_at IS NOT NULL;
    DELETE FROM public.outbox WHERE kind = 'assignment' AND (data->>'task_id') = ANY(names) AND sent_at IS NOT NULL;
    DELETE FROM public.reservations WHERE task_id = ANY(ids);
    DELETE FROM public.cancel_requests WHERE task_id = ANY(ids);
    DELETE FROM public.attempts WHERE task_id = ANY(ids);
    DELETE FROM public.tasks WHERE task_id = ANY(ids);
    GET DIAGNOSTICS pruned = ROW_COUNT;
    RETURN pruned;
END
$$
"""

#: Functions are executable by PUBLIC by default: only the sweeper's grant (devsched.store.roles) remains.
REVOKE_PUBLIC = "REVOKE ALL ON FUNCTION devsched_prune(interval, integer) FROM PUBLIC"

DOWNGRADE = """
DROP FUNCTION devsched_prune(interval, integer)
"""


def upgrade() -> None:
    """Create the prune function, executable by nobody until the grants give it to the sweeper."""
    op.execute(CREATE_FUNCTION)
    op.execute(REVOKE_PUBLIC)


def downgrade() -> None:
    """Drop the prune function."""
    op.execute(DOWNGRADE)
