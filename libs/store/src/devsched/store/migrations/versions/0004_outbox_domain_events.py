"""The outbox holds domain events, not wire messages: a `kind` and the event's fields, no subject or msg id.

Every row is converted, sent or not, so a message that was waiting at upgrade time is published after it
exactly as before (the relay derives the same subject and `Nats-Msg-Id` from the event). An assignment's
host comes from its old subject `P.assign.<host_id>`. The uniqueness the `msg_id` column gave is kept:
one row per task and event seq, one per task and attempt.

The downgrade writes the wire columns back; it needs the subject prefix, which the outbox no longer
holds: `DEVSCHED_SUBJECT_PREFIX` (the services' setting), `devsched` when unset.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-04
"""

import os
from collections.abc import Sequence

from alembic import op
from sqlalchemy import text

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

UPGRADE = """
ALTER TABLE outbox ADD COLUMN kind text, ADD COLUMN data jsonb;

UPDATE outbox SET kind = 'assignment', data = jsonb_build_object(
        'task_id', payload->'task_id',
        'attempt', payload->'attempt',
        'lease_id', payload->'lease_id',
        'host_id', to_jsonb(split_part(subject, '.', 3)),
        'device_id', payload->'device_id',
        'plan', payload->'plan',
        'ttl_s', payload->'ttl_s',
        'expires_at', payload->'expires_at')
WHERE split_part(subject, '.', 2) = 'assign';

UPDATE outbox SET kind = 'task_event', data = jsonb_build_object(
        'kind', payload->'event',
        'task_id', payload->'task_id',
        'seq', payload->'seq',
        'status', payload->'status',
        'at', payload->'at',
        'attempt', payload->'attempt',
        'host_id', payload->'host_id',
        'device_id', payload->'device_id',
        'reason', payload->'reason',
        'progress', payload->'progress')
WHERE split_part(subject, '.', 2) = 'events' AND split_part(subject, '.', 3) = 'task';

DO $$
BEGIN
    IF EXISTS (SELECT FROM outbox WHERE kind IS NULL) THEN
        RAISE EXCEPTION 'outbox rows with a subject that is neither P.assign.* nor P.events.task.*: %',
            (SELECT string_agg(DISTINCT subject, ', ') FROM outbox WHERE kind IS NULL);
    END IF;
END
$$;

ALTER TABLE outbox
    DROP COLUMN subject,
    DROP COLUMN msg_id,
    DROP COLUMN payload,
    ALTER COLUMN kind SET NOT NULL,
    ALTER COLUMN data SET NOT NULL,
    ADD CONSTRAINT ck_outbox_kind CHECK (kind IN ('task_event', 'assignment')),
    ADD CONSTRAINT ck_outbox_data_object CHECK (jsonb_typeof(data) = 'object');

CREATE UNIQUE INDEX uq_outbox_task_event ON outbox ((data->>'task_id'), ((data->>'seq')::integer))
    WHERE kind = 'task_event';

CREATE UNIQUE INDEX uq_outbox_assignment ON outbox ((data->>'task_id'), ((data->>'attempt')::integer))
    WHERE kind = 'assignment'
"""

DOWNGRADE = """
ALTER TABLE outbox ADD COLUMN subject text, ADD COLUMN msg_id text, ADD COLUMN payload jsonb;

UPDATE outbox SET
    subject = :prefix || '.assign.' || (data->>'host_id'),
    msg_id = (data->>'task_id') || '.' || (data->>'attempt'),
    payload = data - 'host_id'
WHERE kind = 'assignment';

UPDATE outbox SET
    subject = :prefix || '.events.task.' || (data->>'task_id'),
    msg_id = (data->>'task_id') || ':' || (data->>'seq'),
    payload = jsonb_build_object('event', data->'kind') || (data - 'kind' - 'progress')
        || CASE WHEN data->>'kind' = 'progress' THEN jsonb_build_object('progress', data->'progress')
                ELSE '{}'::jsonb END
WHERE kind = 'task_event';

ALTER TABLE outbox
    DROP COLUMN kind,
    DROP COLUMN data,
    ALTER COLUMN subject SET NOT NULL,
    ALTER COLUMN msg_id SET NOT NULL,
    ALTER COLUMN payload SET NOT NULL,
    ADD CONSTRAINT uq_outbox_msg_id UNIQUE (msg_id)
"""


def _statements(script: str) -> list[str]:
    return [s for s in script.split(";\n\n") if s.strip()]


def upgrade() -> None:
    """Convert every row to `kind` and `data`, then drop the wire columns."""
    for statement in _statements(UPGRADE):
        op.execute(statement)


def downgrade() -> None:
    """Write subjects, message ids and bodies back from the events, then drop `kind` and `data`."""
    params = {"prefix": os.environ.get("DEVSCHED_SUBJECT_PREFIX") or "devsched"}
    for statement in _statements(DOWNGRADE):
        op.get_bind().execute(text(statement), params if ":prefix" in statement else {})
