"""Cheaper row checks (issue 10): the same rules, less work on every write of a task or an attempt.

Every INSERT or UPDATE of a row evaluates all of its table's check constraints, and each statement first
reads their stored expression trees back from text; a no-op task writes its task row four times and its
attempt row three. The status lists were stored as `ARRAY['queued'::text, ...]` (an array built from one
node per name); they are now one array constant each (`'{...}'::text[]`): the same values, half the text
to read back. The constraints keep their names and what they accept.

`uq_tasks_idempotency_key` held an entry for every version of every task row, though only keys that are
set are unique: it is now a partial unique index under the same name (a duplicate key is refused with
that name, as before, and `ON CONFLICT DO NOTHING` still takes it as an arbiter), so a task without a key
costs no entry in it on any write.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-15
"""

from collections.abc import Sequence

from devsched.store.migrations import execute_script

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

UPGRADE = """
ALTER TABLE tasks
    DROP CONSTRAINT ck_tasks_status,
    ADD CONSTRAINT ck_tasks_status
        CHECK (status = ANY ('{queued,assigned,dispatched,done,failed,cancelled}'::text[])),
    DROP CONSTRAINT ck_tasks_in_flight_has_attempt,
    ADD CONSTRAINT ck_tasks_in_flight_has_attempt
        CHECK (status <> ALL ('{assigned,dispatched}'::text[]) OR attempt_count >= 1),
    DROP CONSTRAINT ck_tasks_kind,
    ADD CONSTRAINT ck_tasks_kind CHECK (kind = ANY ('{user,health}'::text[])),
    DROP CONSTRAINT uq_tasks_idempotency_key;

CREATE UNIQUE INDEX uq_tasks_idempotency_key ON tasks (idempotency_key) WHERE idempotency_key IS NOT NULL;

ALTER TABLE attempts
    DROP CONSTRAINT ck_attempts_status,
    ADD CONSTRAINT ck_attempts_status
        CHECK (status = ANY ('{active,expired,done,failed,cancelled,released}'::text[])),
    DROP CONSTRAINT ck_attempts_end_reason,
    ADD CONSTRAINT ck_attempts_end_reason CHECK (
        end_reason = ANY ('{done,failed,cancelled,lease_expired,released,attempt_timeout,deadline_exceeded}'::text[])),
    DROP CONSTRAINT ck_attempts_end_reason_matches,
    ADD CONSTRAINT ck_attempts_end_reason_matches CHECK (
        status = 'active'
        OR (status = 'expired' AND end_reason = ANY ('{lease_expired,attempt_timeout,deadline_exceeded}'::text[]))
        OR (status = end_reason))
"""

DOWNGRADE = """
ALTER TABLE attempts
    DROP CONSTRAINT ck_attempts_end_reason_matches,
    ADD CONSTRAINT ck_attempts_end_reason_matches CHECK (
        status = 'active'
        OR (status = 'expired' AND end_reason IN ('lease_expired', 'attempt_timeout', 'deadline_exceeded'))
        OR (status = end_reason)),
    DROP CONSTRAINT ck_attempts_end_reason,
    ADD CONSTRAINT ck_attempts_end_reason CHECK (
        end_reason IN ('done', 'failed', 'cancelled', 'lease_expired', 'released', 'attempt_timeout',
                       'deadline_exceeded')),
    DROP CONSTRAINT ck_attempts_status,
    ADD CONSTRAINT ck_attempts_status
        CHECK (status IN ('active', 'expired', 'done', 'failed', 'cancelled', 'released'));

DROP INDEX uq_tasks_idempotency_key;

ALTER TABLE tasks
    ADD CONSTRAINT uq_tasks_idempotency_key UNIQUE (idempotency_key),
    DROP CONSTRAINT ck_tasks_kind,
    ADD CONSTRAINT ck_tasks_kind CHECK (kind IN ('user', 'health')),
    DROP CONSTRAINT ck_tasks_in_flight_has_attempt,
    ADD CONSTRAINT ck_tasks_in_flight_has_attempt
        CHECK (status NOT IN ('assigned', 'dispatched') OR attempt_count >= 1),
    DROP CONSTRAINT ck_tasks_status,
    ADD CONSTRAINT ck_tasks_status
        CHECK (status IN ('queued', 'assigned', 'dispatched', 'done', 'failed', 'cancelled'))
"""


def upgrade() -> None:
    """Store the status lists as array constants; index only the idempotency keys that are set."""
    execute_script(UPGRADE)


def downgrade() -> None:
    """Back to the lists of names and the full unique constraint (every key set is unique either way)."""
    execute_script(DOWNGRADE)
