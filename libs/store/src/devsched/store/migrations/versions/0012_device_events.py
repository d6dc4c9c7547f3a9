"""Device events (issue 13): the outbox holds `device_event` rows, a device quarantined or returned.

Only the kind constraint changes. The downgrade deletes the device events not yet sent (the release it
goes back to could not publish them; its relay would fail on them) and those sent, then narrows the
constraint again.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-14
"""

from collections.abc import Sequence

from devsched.store.migrations import execute_script

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

UPGRADE = """
ALTER TABLE outbox
    DROP CONSTRAINT ck_outbox_kind,
    ADD CONSTRAINT ck_outbox_kind CHECK (kind IN ('task_event', 'assignment', 'device_event'))
"""

DOWNGRADE = """
DELETE FROM outbox WHERE kind = 'device_event';

ALTER TABLE outbox
    DROP CONSTRAINT ck_outbox_kind,
    ADD CONSTRAINT ck_outbox_kind CHECK (kind IN ('task_event', 'assignment'))
"""


def upgrade() -> None:
    """Allow `device_event` rows in the outbox."""
    execute_script(UPGRADE)


def downgrade() -> None:
    """Drop the device events (unsent ones included: the older release cannot publish them)."""
    execute_script(DOWNGRADE)
