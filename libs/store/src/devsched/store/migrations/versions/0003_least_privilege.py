"""Least privilege: no PUBLIC privileges; the scheduler's and the sweeper's roles get only their DML.

The grants themselves live in `devsched.store.roles.GRANTS`, the one source that this revision applies
and that every later migration run applies again (env.py), so a table added by a later revision gets
its grants in the same run. Roles are cluster-wide and are not created here (see roles.py).

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-02
"""

from collections.abc import Sequence

from alembic import context, op

from devsched.store.roles import DatabaseRoles, apply_grants, revoke_grants

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _roles() -> DatabaseRoles:
    roles = context.config.attributes.get("devsched_roles")
    return roles if isinstance(roles, DatabaseRoles) else DatabaseRoles.from_env()


def upgrade() -> None:
    """Revoke PUBLIC's privileges and grant each service role its own."""
    apply_grants(op.get_bind(), _roles())


def downgrade() -> None:
    """Take the service roles' privileges back and give PUBLIC PostgreSQL 15's defaults again."""
    revoke_grants(op.get_bind(), _roles())
