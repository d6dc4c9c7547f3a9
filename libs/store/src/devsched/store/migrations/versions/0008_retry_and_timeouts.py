"""Retry policies and time limits (issue 13): a task's policy, its limits, and its backoff.

- `tasks.retry` (jsonb, null: no policy), `queue_timeout_s`, `attempt_timeout_s` (seconds, > 0) and
  `deadline` are what the submit said; `not_before` is when a retried task may run again (the placement
  statements skip a queued task until then, by the database clock), `avoid_device_id` the device its last
  attempt failed on (preferred against when another matches).
- Attempts the sweeper ends for a time limit are `expired` with end reason `attempt_timeout` or
  `deadline_exceeded`.
- Two partial indexes keep the sweeper's timeout passes to the tasks that have a limit: a queue without
  limits costs them nothing.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-10
"""

from collections.abc import Sequence

from devsched.store.migrations import execute_script

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

UPGRADE = """
ALTER TABLE tasks
    ADD COLUMN retry jsonb,
    ADD COLUMN queue_timeout_s double precision,
    ADD COLUMN attempt_timeout_s double precision,
    ADD COLUMN deadline timestamptz,
    ADD COLUMN not_before timestamptz,
    ADD COLUMN avoid_device_id text,
    ADD CONSTRAINT ck_tasks_retry_object CHECK (retry IS NULL OR jsonb_typeof(retry) = 'object'),
    ADD CONSTRAINT ck_tasks_queue_timeout CHECK (queue_timeout_s > 0),
    ADD CONSTRAINT ck_tasks_attempt_timeout CHECK (attempt_timeout_s > 0);

CREATE INDEX ix_tasks_queued_limits ON tasks (task_id)
    WHERE status = 'queued' AND (queue_timeout_s IS NOT NULL OR deadline IS NOT NULL);

CREATE INDEX ix_tasks_in_flight_limits ON tasks (task_id)
    WHERE status IN ('assigned', 'dispatched') AND (attempt_timeout_s IS NOT NULL OR deadline IS NOT NULL);

ALTER TABLE attempts
    DROP CONSTRAINT ck_attempts_end_reason,
    ADD CONSTRAINT ck_attempts_end_reason CHECK (
        end_reason IN ('done', 'failed', 'cancelled', 'lease_expired', 'released', 'attempt_timeout',
                       'deadline_exceeded')),
    DROP CONSTRAINT ck_attempts_end_reason_matches,
    ADD CONSTRAINT ck_attempts_end_reason_matches CHECK (
        status = 'active'
        OR (status = 'expired' AND end_reason IN ('lease_expired', 'attempt_timeout', 'deadline_exceeded'))
        OR (status = end_reason))
"""

DOWNGRADE = """
UPDATE attempts SET end_reason = 'lease_expired' WHERE end_reason IN ('attempt_timeout', 'deadline_exceeded');

ALTER TABLE attempts
    DROP CONSTRAINT ck_attempts_end_reason_matches,
    ADD CONSTRAINT ck_attempts_end_reason_matches CHECK (
        status = 'active'
        OR (status = 'expired' AND end_reason = 'lease_expired')
        OR (status = end_reason)),
    DROP CONSTRAINT ck_attempts_end_reason,
    ADD CONSTRAINT ck_attempts_end_reason
        CHECK (end_reason IN ('done', 'failed', 'cancelled', 'lease_expired', 'released'));

DROP INDEX ix_tasks_in_flight_limits;

DROP INDEX ix_tasks_queued_limits;

ALTER TABLE tasks
    DROP CONSTRAINT ck_tasks_attempt_timeout,
    DROP CONSTRAINT ck_tasks_queue_timeout,
    DROP CONSTRAINT ck_tasks_retry_object,
    DROP COLUMN avoid_device_id,
    DROP COLUMN not_before,
    DROP COLUMN deadline,
    DROP COLUMN attempt_timeout_s,
    DROP COLUMN queue_timeout_s,
    DROP COLUMN retry
"""


def upgrade() -> None:
    """Add the tasks' retry policy, time limits and backoff columns, and the timeout end reasons."""
    execute_script(UPGRADE)


def downgrade() -> None:
    """Drop them; attempts ended by a time limit become plain lease expiries."""
    execute_script(DOWNGRADE)
