"""Health checks by name (issue 13 item 2): operators set, list and remove them by a name of their own.

- `health_checks.name` becomes the key (a selector may have several checks over time, and the CLI
  names what it sets); rows of 0010 (none are written by that release) get a name from their selector.
- `deleted_at`: removing a check is a row update (the scheduler's role deletes nothing); a removed
  name may be set again, which brings the row back.
- An index on the open health tasks' devices is already there (0010); the health pass reads the
  checks (a few rows) and the devices.

The downgrade drops the removed checks and the names, keying the rest by selector again.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-12
"""

from collections.abc import Sequence

from devsched.store.migrations import execute_script

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

UPGRADE = """
ALTER TABLE health_checks ADD COLUMN name text, ADD COLUMN deleted_at timestamptz;

UPDATE health_checks SET name = 'check-' || left(md5(selector_labels::text), 12) WHERE name IS NULL;

ALTER TABLE health_checks
    DROP CONSTRAINT health_checks_pkey,
    ALTER COLUMN name SET NOT NULL,
    ADD CONSTRAINT health_checks_pkey PRIMARY KEY (name)
"""

DOWNGRADE = """
DELETE FROM health_checks
WHERE deleted_at IS NOT NULL
   OR name <> (SELECT min(h.name) FROM health_checks h WHERE h.selector_labels = health_checks.selector_labels);

ALTER TABLE health_checks
    DROP CONSTRAINT health_checks_pkey,
    ADD CONSTRAINT health_checks_pkey PRIMARY KEY (selector_labels),
    DROP COLUMN deleted_at,
    DROP COLUMN name
"""


def upgrade() -> None:
    """Key the health checks by name; a removal marks `deleted_at`."""
    execute_script(UPGRADE)


def downgrade() -> None:
    """Back to one check per selector."""
    execute_script(DOWNGRADE)
