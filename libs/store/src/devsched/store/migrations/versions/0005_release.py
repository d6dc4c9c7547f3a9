"""Hosts give attempts back: attempt status and end reason `released`, and a count of releases per task.

A released attempt does not spend one of the task's `max_attempts` (a task with one attempt survives an
agent's rollout), yet attempt numbers stay 1, 2, 3 without gaps. The bound the database keeps becomes
`attempt_count <= max_attempts + releases`: every attempt beyond the limit is one a host gave back, and
`releases` never exceeds the attempts made.

The downgrade turns released attempts into expired ones (the nearest meaning the older schema has: ended
without a report) and refuses when a task made more attempts than it allows, which the older bound forbids.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-06
"""

from collections.abc import Sequence

from devsched.store.migrations import execute_script

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

UPGRADE = """
ALTER TABLE tasks
    ADD COLUMN releases integer NOT NULL DEFAULT 0,
    ADD CONSTRAINT ck_tasks_releases CHECK (releases BETWEEN 0 AND attempt_count),
    DROP CONSTRAINT ck_tasks_attempt_count,
    ADD CONSTRAINT ck_tasks_attempt_count CHECK (attempt_count BETWEEN 0 AND max_attempts + releases);

ALTER TABLE attempts
    DROP CONSTRAINT ck_attempts_status,
    ADD CONSTRAINT ck_attempts_status
        CHECK (status IN ('active', 'expired', 'done', 'failed', 'cancelled', 'released')),
    DROP CONSTRAINT ck_attempts_end_reason,
    ADD CONSTRAINT ck_attempts_end_reason
        CHECK (end_reason IN ('done', 'failed', 'cancelled', 'lease_expired', 'released'))
"""

DOWNGRADE = """
DO $$
BEGIN
    IF EXISTS (SELECT FROM tasks WHERE attempt_count > max_attempts) THEN
        RAISE EXCEPTION 'tasks with more attempts than max_attempts (released attempts): %',
            (SELECT string_agg(task_id::text, ', ') FROM tasks WHERE attempt_count > max_attempts);
    END IF;
END
$$;

UPDATE attempts SET status = 'expired', end_reason = 'lease_expired' WHERE status = 'released';

ALTER TABLE attempts
    DROP CONSTRAINT ck_attempts_end_reason,
    ADD CONSTRAINT ck_attempts_end_reason CHECK (end_reason IN ('done', 'failed', 'cancelled', 'lease_expired')),
    DROP CONSTRAINT ck_attempts_status,
    ADD CONSTRAINT ck_attempts_status CHECK (status IN ('active', 'expired', 'done', 'failed', 'cancelled'));

ALTER TABLE tasks
    DROP CONSTRAINT ck_tasks_attempt_count,
    ADD CONSTRAINT ck_tasks_attempt_count CHECK (attempt_count BETWEEN 0 AND max_attempts),
    DROP CONSTRAINT ck_tasks_releases,
    DROP COLUMN releases
"""


def upgrade() -> None:
    """Add `tasks.releases` and the `released` attempt status and end reason; widen the attempt bound."""
    execute_script(UPGRADE)


def downgrade() -> None:
    """Turn released attempts into expired ones and restore the older bound (refused if it cannot hold)."""
    execute_script(DOWNGRADE)
