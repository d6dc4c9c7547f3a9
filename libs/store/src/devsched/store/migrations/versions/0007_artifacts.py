"""Artifacts (issue 12): one row per stored file of an attempt, and pruning that removes them with their task.

A row names the file (its path under the attempt's artifacts directory), the step after which it was
stored, its size and SHA-256, the host that uploaded it and its object in the Object Store bucket
`<PU>_ARTIFACTS`. Its attempt is a foreign key: a row exists only for an attempt that exists. The bytes
are in NATS, not here: the bucket's max age removes them, and `devsched_prune` removes the rows with their
task (it is replaced here by the same function plus that one DELETE).

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-10
"""

import importlib
from collections.abc import Sequence

from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

CREATE_TABLE = r"""
CREATE TABLE artifacts (
    task_id uuid NOT NULL,
    attempt integer NOT NULL,
    name text NOT NULL CONSTRAINT ck_artifacts_name CHECK (length(name) BETWEEN 1 AND 1024),
    step text NOT NULL,
    size bigint NOT NULL CONSTRAINT ck_artifacts_size CHECK (size >= 0),
    sha256 text NOT NULL CONSTRAINT ck_artifacts_sha256 CHECK (sha256 ~ '^[0-9a-f]{64}$'),
    host_id text NOT NULL,
    object text NOT NULL,
    stored_at timestamptz NOT NULL,
    CONSTRAINT pk_artifacts PRIMARY KEY (task_id, attempt, name),
    CONSTRAINT fk_artifacts_attempt FOREIGN KEY (task_id, attempt) REFERENCES attempts (task_id, attempt)
)
"""

#: The line of `devsched_prune` (migration 0006) before which the artifacts of the pruned tasks go.
_ANCHOR = "    DELETE FROM public.attempts WHERE task_id = ANY(ids);\n"
_PRUNE_0006: str = importlib.import_module("devsched.store.migrations.versions.0006_retention").CREATE_FUNCTION
assert _ANCHOR in _PRUNE_0006
#: `devsched_prune` with the artifacts rows of the pruned tasks deleted first (their attempts follow).
CREATE_PRUNE = _PRUNE_0006.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1).replace(
    _ANCHOR, "    DELETE FROM public.artifacts WHERE task_id = ANY(ids);\n" + _ANCHOR, 1
)
RESTORE_PRUNE = _PRUNE_0006.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1)


def upgrade() -> None:
    """Create the artifacts table; pruning removes its rows with their task."""
    op.execute(CREATE_TABLE)
    op.execute(CREATE_PRUNE)


def downgrade() -> None:
    """Pruning as in 0006, and the table dropped (the rows are lost; the bucket keeps the bytes until they age out)."""
    op.execute(RESTORE_PRUNE)
    op.execute("DROP TABLE artifacts")
