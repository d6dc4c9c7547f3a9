"""Tasks keep the trace context of their submit, so assignment and sweep events join the task's trace.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Add `tasks.trace_headers` (W3C traceparent/tracestate of the submit request)."""
    op.execute("ALTER TABLE tasks ADD COLUMN trace_headers jsonb NOT NULL DEFAULT '{}'")


def downgrade() -> None:
    """Drop the column."""
    op.execute("ALTER TABLE tasks DROP COLUMN trace_headers")
