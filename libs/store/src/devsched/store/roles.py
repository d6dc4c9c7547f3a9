"""Least privilege in Postgres: an owner role for the schema, one role per service with only its DML.

Who does what:

- the owner (`devsched_owner`) owns the database and every schema object; migrations run as it;
- the scheduler (`devsched_scheduler`) reads every table and inserts and updates what the API, the
  assignment loop and the outbox relay write (a task's `releases` count included: releases come through
  its API); outbox rows it only inserts, never rewrites, and it records their publication in
  `outbox_sent` (migration 0017); it deletes nothing and cannot change the schema;
- the sweeper (`devsched_sweeper`) reads tasks, attempts, devices, cancellation requests and the schema's
  migration (`alembic_version`, for its readiness check), updates only
  the columns a sweep writes (a task's status, reason, updated_at and event_seq; an attempt's status,
  end_reason and ended_at; a device's available_after) and inserts outbox rows: it cannot submit a task,
  rewrite a plan, or count a release (which would let a task run past its `max_attempts`); it deletes
  only through `devsched_prune` (migration 0006), which removes ended tasks older than the retention and
  nothing else.

The grants are kept by migration 0003 and applied again at the end of every migration run (`GRANTS` is the
single source; a table left out of it is logged), so they converge on this module whatever happened
before. Roles are cluster-wide and created by whoever administers the cluster: CloudNativePG's
`managed.roles` in production, `ensure_roles` (as a superuser) for `devsched up` and the tests.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, fields

from sqlalchemy import text
from sqlalchemy.engine import Connection

from devsched.core.ids import is_token

log = logging.getLogger("devsched.store.roles")

#: Privileges per service and table (column lists in parentheses are column-level grants).
GRANTS: Mapping[str, Mapping[str, str]] = {
    "scheduler": {
        "hosts": "SELECT, INSERT, UPDATE",
        "devices": "SELECT, INSERT, UPDATE",
        "tasks": "SELECT, INSERT, UPDATE",
        "attempts": "SELECT, INSERT, UPDATE",
        # a view of the attempts since 0015; INSERT for an older release's writes, which its trigger drops
        "reservations": "SELECT, INSERT",
        "cancel_requests": "SELECT, INSERT",
        # the event history is insert-only; publication goes to `outbox_sent` (migration 0017)
        "outbox": "SELECT, INSERT",
        "outbox_sent": "SELECT, INSERT",
        # a view of the rows not yet published; UPDATE only because a claim locks rows through it (`SELECT
        # ... FOR UPDATE` asks for it): the view cannot be written through
        "outbox_unsent": "SELECT, UPDATE",
        "alembic_version": "SELECT",  # readiness: the schema is this release's (store/health.py)
        # issue 12: a commit stores or replaces a row; rows go only through `devsched_prune`
        "artifacts": "SELECT, INSERT, UPDATE",
        # issue 13: operators register health checks; the scheduler submits the health tasks (migration 0010)
        "health_checks": "SELECT, INSERT, UPDATE",
        # operators' acts on devices (forget, label), one row each, never changed (migration 0016)
        "device_audit": "SELECT, INSERT",
    },
    "sweeper": {
        # not `releases`: only the scheduler's release endpoint counts one (migration 0005)
        # `not_before` and `avoid_device_id`: the backoff of a task the retry policy queues again (migration 0008)
        "tasks": "SELECT, UPDATE (status, reason, updated_at, event_seq, not_before, avoid_device_id)",
        "attempts": "SELECT, UPDATE (status, end_reason, ended_at)",
        # the health counters: an expiry is an infrastructure failure of its device (migration 0010)
        "devices": "SELECT, UPDATE (available_after, infra_failures, quarantined_at, quarantine_reason)",
        "cancel_requests": "SELECT",
        "outbox": "INSERT",
        "alembic_version": "SELECT",  # readiness, as for the scheduler
    },
}

#: Sequences each service draws from (`outbox.id` and `outbox_sent.seq` are bigserials).
SEQUENCE_GRANTS: Mapping[str, tuple[str, ...]] = {
    "scheduler": ("outbox_id_seq", "device_audit_id_seq", "outbox_sent_seq_seq"),
    "sweeper": ("outbox_id_seq",),
}

#: Functions each service may execute (by signature); every other function is revoked from it, and the
#: migration that creates one revokes it from PUBLIC.
FUNCTION_GRANTS: Mapping[str, tuple[str, ...]] = {
    "scheduler": ("devsched_outbox_floor()",),  # read by `outbox_unsent` (migration 0017)
    "sweeper": ("devsched_prune(interval, integer)",),
}

#: Tables no service touches on purpose (none: `alembic_version` is read by the readiness checks, and only read).
UNGRANTED_TABLES: frozenset[str] = frozenset()

#: Session defaults set on the roles (`ALTER ROLE ... SET`), the same as the services' engine sets per
#: connection (engine.DatabaseTimeouts), so a client that forgets them (psql, a script) still has them.
SERVICE_ROLE_SETTINGS: Mapping[str, str] = {
    "statement_timeout": "10s",
    "lock_timeout": "5s",
    "idle_in_transaction_session_timeout": "30s",
}
#: The owner runs migrations, which may take long, but must neither queue behind a lock for long (every
#: query behind it waits too) nor sit idle in a transaction.
OWNER_ROLE_SETTINGS: Mapping[str, str] = {
    "lock_timeout": "30s",
    "idle_in_transaction_session_timeout": "5min",
}

#: Serializes the grant passes of concurrent migration runs on one database ("tuple concurrently updated").
_GRANTS_LOCK = 0x64657673  # "devs"
#: Serializes role creation (`ensure_roles`); advisory locks are per database: take it in `postgres`.
ROLES_LOCK = _GRANTS_LOCK + 1
#: Held for a whole migration run (`migrations/env.py`): concurrent runs take turns.
MIGRATIONS_LOCK = _GRANTS_LOCK + 2


@dataclass(frozen=True, slots=True)
class DatabaseRoles:
    """The role names; defaults `devsched_owner`, `devsched_scheduler`, `devsched_sweeper`.

    `from_env` reads `DEVSCHED_DB_OWNER_ROLE`, `DEVSCHED_DB_SCHEDULER_ROLE` and `DEVSCHED_DB_SWEEPER_ROLE`,
    for a cluster where these names are taken (each a token: letters, digits, `_`, `-`).
    """

    owner: str = "devsched_owner"
    scheduler: str = "devsched_scheduler"
    sweeper: str = "devsched_sweeper"

    def __post_init__(self) -> None:
        for f in fields(self):
            name = getattr(self, f.name)
            if not is_token(name) or len(name) > 63 or name.lower().startswith("pg_"):
                raise ValueError(f"database role name for {f.name} {name!r}: 1-63 of A-Z a-z 0-9 _ -, not pg_...")
        if len({self.owner, self.scheduler, self.sweeper}) != 3:
            raise ValueError("the owner, scheduler and sweeper database roles must be three different roles")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> DatabaseRoles:
        """The names from `DEVSCHED_DB_<OWNER|SCHEDULER|SWEEPER>_ROLE`, defaults where unset."""
        env = os.environ if env is None else env
        given = {f.name: env.get(f"DEVSCHED_DB_{f.name.upper()}_ROLE") for f in fields(cls)}
        try:
            return cls(**{k: v for k, v in given.items() if v})
        except ValueError as exc:
            names = ", ".join(f"DEVSCHED_DB_{k.upper()}_ROLE={v!r}" for k, v in given.items() if v)
            raise ValueError(f"{names}: {exc}") from None

    def service(self, name: str) -> str:
        """The role of service `name` (`scheduler` or `sweeper`)."""
        if name not in GRANTS:
            raise KeyError(f"no database role for service {name!r}")
        return str(getattr(self, name))


def quote_ident(name: str) -> str:
    """`name` as a quoted SQL identifier."""
    return '"' + name.replace('"', '""') + '"'


def _quote_literal(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def _existing_roles(conn: Connection, names: list[str]) -> set[str]:
    rows = conn.execute(text("SELECT rolname FROM pg_roles WHERE rolname = ANY(:names)"), {"names": names})
    return {str(r[0]) for r in rows}


def _tables(conn: Connection) -> set[str]:
    """The tables and views of schema `public` (`reservations` is a view since migration 0015)."""
    rows = conn.execute(
        text(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public'"
            " UNION SELECT viewname FROM pg_views WHERE schemaname = 'public'"
        )
    )
    return {str(r[0]) for r in rows}


def _columns(conn: Connection) -> dict[str, set[str]]:
    rows = conn.execute(
        text("SELECT table_name, column_name FROM information_schema.columns WHERE table_schema = 'public'")
    )
    columns: dict[str, set[str]] = {}
    for table, column in rows:
        columns.setdefault(str(table), set()).add(str(column))
    return columns


def _existing(privileges: str, columns: set[str] | None) -> str:
    """`privileges` without the columns of its column lists that the table does not have (yet).

    A migration run applies the grants after each revision (0003 among them), when columns that a later
    revision adds do not exist; the run's final pass grants them. A list left empty drops its privilege.
    """
    if columns is None:
        return privileges
    kept: list[str] = []
    for part in re.split(r",\s*(?![^()]*\))", privileges):
        name, _, listed = part.partition("(")
        if not listed:
            kept.append(part.strip())
            continue
        present = [c.strip() for c in listed.rstrip(") ").split(",") if c.strip() in columns]
        if present:
            kept.append(f"{name.strip()} ({', '.join(present)})")
    return ", ".join(kept)


def _sequences(conn: Connection) -> set[str]:
    rows = conn.execute(text("SELECT sequencename FROM pg_sequences WHERE schemaname = 'public'"))
    return {str(r[0]) for r in rows}


def _functions(conn: Connection) -> set[str]:
    rows = conn.execute(
        text(
            "SELECT p.proname || '(' || oidvectortypes(p.proargtypes) || ')' FROM pg_proc p"
            " JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = 'public'"
        )
    )
    return {str(r[0]) for r in rows}


def grant_statements(
    roles: DatabaseRoles,
    tables: set[str],
    sequences: set[str],
    present: set[str],
    functions: set[str],
    columns: Mapping[str, set[str]] | None = None,
) -> list[str]:
    """The statements that make the service roles' privileges exactly `GRANTS` (for roles in `present`).

    Everything a role had is revoked first, in the same transaction, so a privilege dropped from `GRANTS`
    is dropped from the database too, and no session ever sees a role between the two.
    """
    statements: list[str] = []
    for service, table_grants in GRANTS.items():
        role = quote_ident(roles.service(service))
        if roles.service(service) not in present:
            continue
        statements += [
            f"REVOKE ALL ON ALL TABLES IN SCHEMA public FROM {role}",
            f"REVOKE ALL ON ALL SEQUENCES IN SCHEMA public FROM {role}",
            f"REVOKE ALL ON ALL FUNCTIONS IN SCHEMA public FROM {role}",
            f"GRANT USAGE ON SCHEMA public TO {role}",
        ]
        for table, privileges in table_grants.items():
            granted = _existing(privileges, None if columns is None else columns.get(table, set()))
            if table in tables and granted:
                statements.append(f"GRANT {granted} ON TABLE public.{quote_ident(table)} TO {role}")
        for sequence in SEQUENCE_GRANTS.get(service, ()):
            if sequence in sequences:
                statements.append(f"GRANT USAGE ON SEQUENCE public.{quote_ident(sequence)} TO {role}")
        for function in FUNCTION_GRANTS.get(service, ()):
            if function in functions:
                statements.append(f"GRANT EXECUTE ON FUNCTION public.{function} TO {role}")
    return statements


def apply_grants(conn: Connection, roles: DatabaseRoles | None = None) -> list[str]:
    """Converge the database on `GRANTS`; idempotent; returns the service roles that were missing.

    Run by the migrating role (the owner) inside a transaction: no PUBLIC privilege on the database or
    on schema `public` (nothing may depend on them), CONNECT for the service roles that exist, and their
    table and sequence privileges. A missing role is skipped and logged, so a database migrated before
    its roles exist works for whoever owns it; the next migration run grants it.
    """
    roles = roles or DatabaseRoles.from_env()
    conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _GRANTS_LOCK})
    services = [roles.service(s) for s in GRANTS]
    present = _existing_roles(conn, services)
    missing = [r for r in services if r not in present]
    if missing:
        log.warning("database roles %s do not exist: not granted (create them, then migrate again)", missing)
    tables, sequences = _tables(conn), _sequences(conn)
    forgotten = sorted(tables - UNGRANTED_TABLES - {t for g in GRANTS.values() for t in g})
    if forgotten:
        log.warning("tables %s are in no service's grants (devsched.store.roles.GRANTS)", forgotten)
    database = quote_ident(str(conn.execute(text("SELECT current_database()")).scalar_one()))
    owns_schema = bool(
        conn.execute(
            text("SELECT pg_has_role(current_user, nspowner, 'USAGE') FROM pg_namespace WHERE nspname = 'public'")
        ).scalar_one()
    )
    statements = [f"REVOKE ALL ON DATABASE {database} FROM PUBLIC"]
    if owns_schema:  # before PostgreSQL 15 `public` belongs to the bootstrap superuser: leave it to them
        statements.append("REVOKE ALL ON SCHEMA public FROM PUBLIC")
    statements += [f"GRANT CONNECT ON DATABASE {database} TO {quote_ident(r)}" for r in sorted(present)]
    statements += grant_statements(roles, tables, sequences, present, _functions(conn), _columns(conn))
    for statement in statements:
        conn.exec_driver_sql(statement)
    apply_role_settings(conn, roles, only_if_allowed=True)
    return missing


def revoke_grants(conn: Connection, roles: DatabaseRoles | None = None) -> None:
    """Undo `apply_grants`: the service roles lose everything, PUBLIC gets PostgreSQL 15's defaults back."""
    roles = roles or DatabaseRoles.from_env()
    database = quote_ident(str(conn.execute(text("SELECT current_database()")).scalar_one()))
    for role in sorted(_existing_roles(conn, [roles.service(s) for s in GRANTS])):
        for statement in (
            f"REVOKE ALL ON ALL TABLES IN SCHEMA public FROM {quote_ident(role)}",
            f"REVOKE ALL ON ALL SEQUENCES IN SCHEMA public FROM {quote_ident(role)}",
            f"REVOKE ALL ON ALL FUNCTIONS IN SCHEMA public FROM {quote_ident(role)}",
            f"REVOKE ALL ON SCHEMA public FROM {quote_ident(role)}",
            f"REVOKE ALL ON DATABASE {database} FROM {quote_ident(role)}",
        ):
            conn.exec_driver_sql(statement)
    conn.exec_driver_sql(f"GRANT CONNECT, TEMPORARY ON DATABASE {database} TO PUBLIC")
    conn.exec_driver_sql("GRANT USAGE ON SCHEMA public TO PUBLIC")


def role_settings(roles: DatabaseRoles) -> dict[str, Mapping[str, str]]:
    """The `ALTER ROLE ... SET` defaults of each role."""
    service = SERVICE_ROLE_SETTINGS
    return {roles.owner: OWNER_ROLE_SETTINGS, roles.scheduler: service, roles.sweeper: service}


def role_settings_sql(roles: DatabaseRoles) -> list[str]:
    """`ALTER ROLE ... SET` statements of every role (for an administrator to run, or CloudNativePG)."""
    return [
        f"ALTER ROLE {quote_ident(role)} SET {name} = {_quote_literal(value)}"
        for role, settings in role_settings(roles).items()
        for name, value in settings.items()
    ]


def apply_role_settings(conn: Connection, roles: DatabaseRoles, *, only_if_allowed: bool = False) -> bool:
    """Set the roles' session defaults; returns whether it set any.

    Changing another role's defaults takes a superuser, or (PostgreSQL 16+) CREATEROLE with ADMIN OPTION
    on that role. With `only_if_allowed` (a migration run as the owner) roles the current role may not
    change are skipped and logged; whoever created them set their defaults then (`ensure_roles`).
    """
    settings = role_settings(roles)
    present = _existing_roles(conn, list(settings))
    if only_if_allowed:
        allowed = conn.execute(
            text(
                "SELECT r.rolname FROM pg_roles r, pg_roles me WHERE me.rolname = current_user"
                " AND r.rolname = ANY(:names) AND NOT r.rolsuper AND (me.rolsuper OR (me.rolcreaterole"
                " AND pg_has_role(current_user, r.oid, 'MEMBER WITH ADMIN OPTION')))"
            ),
            {"names": sorted(present)},
        )
        permitted = {str(r[0]) for r in allowed}
        if permitted != present:
            log.info("role timeouts of %s left as they are: not allowed to set them", sorted(present - permitted))
        present = permitted
    for role in sorted(present):
        for name, value in settings[role].items():
            conn.exec_driver_sql(f"ALTER ROLE {quote_ident(role)} SET {name} = {_quote_literal(value)}")
    return bool(present)


#: CREATE ROLE that tolerates a concurrent creation: two sessions that both saw no role both try, and the
#: loser's duplicate_object / unique_violation is swallowed (the role now exists, which is all we want).
_CREATE_ROLE = """
DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = {literal}) THEN
        CREATE ROLE {ident} {attributes};
    END IF;
EXCEPTION WHEN duplicate_object OR unique_violation THEN
    NULL;
END
$$
"""


def ensure_roles_sql(roles: DatabaseRoles, passwords: Mapping[str, str] | None = None) -> list[str]:
    """Statements that create the three roles if missing and (re)set their attributes and defaults.

    Idempotent and race-free (see `_CREATE_ROLE`); run by a superuser. `passwords` maps role names to
    passwords; a role without one keeps its password (or has none: enough where authentication is
    `trust`, as for the embedded Postgres of `devsched up` and the tests).
    """
    passwords = passwords or {}
    statements: list[str] = []
    for role in (roles.owner, roles.scheduler, roles.sweeper):
        attributes = "LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS INHERIT"
        statements.append(
            _CREATE_ROLE.format(literal=_quote_literal(role), ident=quote_ident(role), attributes=attributes)
        )
        statements.append(f"ALTER ROLE {quote_ident(role)} {attributes}")
        if role in passwords:
            statements.append(f"ALTER ROLE {quote_ident(role)} PASSWORD {_quote_literal(passwords[role])}")
    return statements + role_settings_sql(roles)


def ensure_roles(
    conn: Connection, roles: DatabaseRoles | None = None, passwords: Mapping[str, str] | None = None
) -> None:
    """Create the roles if missing and set their attributes and timeouts (as a superuser, in a transaction).

    `ALTER ROLE` of one role from two sessions at once can fail with "tuple concurrently updated", so
    the whole pass holds a cluster-wide lock: an advisory lock is per database, hence one taken in the
    `postgres` database, which every caller uses for this (`ensure_roles_at`).
    """
    roles = roles or DatabaseRoles.from_env()
    conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": ROLES_LOCK})
    for statement in ensure_roles_sql(roles, passwords):
        conn.exec_driver_sql(statement)  # not text(): a ':' in a password is no bind parameter


def ensure_roles_at(
    admin_url: str, roles: DatabaseRoles | None = None, passwords: Mapping[str, str] | None = None
) -> None:
    """`ensure_roles` over a new connection to `admin_url` (a superuser's `postgresql+asyncpg://` URL).

    Synchronous like the migrations: from async code, call it in a thread.
    """
    import asyncio

    from sqlalchemy.ext.asyncio import create_async_engine
    from sqlalchemy.pool import NullPool

    async def run() -> None:
        engine = create_async_engine(admin_url, poolclass=NullPool, hide_parameters=True)
        try:
            async with engine.begin() as conn:
                await conn.run_sync(lambda sync: ensure_roles(sync, roles, passwords))
        finally:
            await engine.dispose()

    asyncio.run(run())


def role_url(url: str, role: str, password: str | None = None) -> str:
    """`url` with `role` as its user (and `password`, else none): the same server and database."""
    from sqlalchemy.engine import make_url

    return make_url(url).set(username=role, password=password).render_as_string(hide_password=False)


def adopt_schema_sql(roles: DatabaseRoles) -> list[str]:
    """Statements (for a superuser, in the database) that give the owner role the objects others own.

    For a database that was created and migrated before the roles existed (by `postgres`, say): the
    database itself and every table and view of schema `public` go to the owner, so that its migrations
    can alter them and its grants count. Indexes and owned sequences follow their tables.
    """
    owner = quote_ident(roles.owner)
    return [
        f"""
        DO $$
        DECLARE r record;
        BEGIN
            EXECUTE format('ALTER DATABASE %I OWNER TO {owner}', current_database());
            FOR r IN SELECT c.relname, c.relkind FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                     WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p', 'v', 'm')
                       AND pg_get_userbyid(c.relowner) <> {_quote_literal(roles.owner)}
            LOOP
                EXECUTE format('ALTER %s public.%I OWNER TO {owner}',
                               CASE r.relkind WHEN 'v' THEN 'VIEW' WHEN 'm' THEN 'MATERIALIZED VIEW' ELSE 'TABLE' END,
                               r.relname);
            END LOOP;
        END
        $$
        """
    ]
