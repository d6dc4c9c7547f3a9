"""Renewals as HOT updates (issue 10): no index on an attempt's expiry, room left in the attempts' pages.

A renewal changes only `attempts.expires_at`. While that column was indexed (`ix_attempts_active_expiry`,
for the sweeper), every renewal was a non-HOT update: a new entry in each of the table's six indexes and
about 600 B of WAL, where a heap-only update writes one tuple (about 130 B). A claim (which also sets the
expiry) paid the same. The sweeper finds expired leases among the active attempts instead: the partial
unique index `uq_attempts_one_active_per_task` lists exactly those (one per busy device: thousands at
most), so a pass reads them and keeps the expired ones, a few milliseconds even at ten thousand.

`fillfactor` 80 leaves a fifth of each new page free, so a renewal's new row version fits beside the old
one (a HOT update needs room on the same page; pruning reclaims the old versions as it goes).

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-02
"""

from collections.abc import Sequence

from devsched.store.migrations import execute_script

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

UPGRADE = """
DROP INDEX ix_attempts_active_expiry;

ALTER TABLE attempts SET (fillfactor = 80)
"""

DOWNGRADE = """
ALTER TABLE attempts RESET (fillfactor);

CREATE INDEX ix_attempts_active_expiry ON attempts (expires_at) WHERE status = 'active'
"""


def upgrade() -> None:
    """Drop the expiry index; leave room for HOT updates in the attempts' pages."""
    execute_script(UPGRADE)


def downgrade() -> None:
    """Index the active attempts' expiry again; the default fill factor."""
    execute_script(DOWNGRADE)
