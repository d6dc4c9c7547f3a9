"""Hosts advertise their actions: `hosts.actions`, what the host's latest registration offered.

Each offer is `{"name", "version", "args_schema"}`, built-ins included; an agent that predates plug-ins
registers none (`[]`). The matching itself needs no column: a host's plug-ins are reserved labels on its
devices, and a task's plug-ins reserved labels in its selector (`devsched.core.actions`).

The downgrade drops the column and the derived labels of the devices (the older release would show them);
a queued task whose selector holds some keeps waiting until a release with plug-ins runs again.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-02
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

UPGRADE = """
ALTER TABLE hosts
    ADD COLUMN actions jsonb NOT NULL DEFAULT '[]',
    ADD CONSTRAINT ck_hosts_actions CHECK (jsonb_typeof(actions) = 'array')
"""

DOWNGRADE_LABELS = """
UPDATE devices
SET labels = labels - ARRAY(SELECT k FROM jsonb_object_keys(labels) AS k WHERE k LIKE 'devsched.action.%')
WHERE EXISTS (SELECT 1 FROM jsonb_object_keys(labels) AS k WHERE k LIKE 'devsched.action.%')
"""
DOWNGRADE = "ALTER TABLE hosts DROP CONSTRAINT ck_hosts_actions, DROP COLUMN actions"


def upgrade() -> None:
    """Add `hosts.actions`."""
    op.execute(UPGRADE)


def downgrade() -> None:
    """Drop `hosts.actions` and the devices' derived action labels."""
    op.execute(DOWNGRADE_LABELS)
    op.execute(DOWNGRADE)
