"""Initial schema: hosts, devices, tasks, attempts, reservations, cancellation requests, outbox.

The invariants of ARCHITECTURE.md are enforced here, not only in code:
1. one active reservation per device (partial unique index);
2. one active attempt per task (partial unique index), attempt numbers 1, 2, 3 with no gaps
   (each attempt after the first references its predecessor);
3. a reservation is active exactly while its attempt is (its status follows the attempt's through an
   ON UPDATE CASCADE foreign key, so no code path can forget to release it);
5. attempt_count never exceeds max_attempts (check);
6. ended attempts keep their end reason (checks; attempts are never deleted);
7. cancellation requests are rows.

Revision ID: 0001
Revises:
Create Date: 2026-11-30
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_TOKEN = r"'^[A-Za-z0-9_-]{1,64}$'"

UPGRADE = f"""
CREATE TABLE hosts (
    host_id text PRIMARY KEY CONSTRAINT ck_hosts_host_id_token CHECK (host_id ~ {_TOKEN}),
    agent_version text,
    heartbeat_interval_s double precision NOT NULL CONSTRAINT ck_hosts_interval CHECK (heartbeat_interval_s > 0),
    registered_at timestamptz NOT NULL,
    last_seen_at timestamptz NOT NULL
);

CREATE TABLE devices (
    device_id text PRIMARY KEY CONSTRAINT ck_devices_device_id_token CHECK (device_id ~ {_TOKEN}),
    host_id text NOT NULL CONSTRAINT fk_devices_host REFERENCES hosts (host_id),
    labels jsonb NOT NULL DEFAULT '{{}}' CONSTRAINT ck_devices_labels_object CHECK (jsonb_typeof(labels) = 'object'),
    -- false once the host re-registered without it: it gets no new work and leaves when idle
    registered boolean NOT NULL DEFAULT true,
    drained boolean NOT NULL DEFAULT false,
    drain_reason text,
    -- post-expiry grace (Chubby's lock-delay): a lost agent may still be running a step on it
    available_after timestamptz,
    updated_at timestamptz NOT NULL
);
CREATE INDEX ix_devices_host ON devices (host_id);

CREATE TABLE tasks (
    task_id uuid PRIMARY KEY,
    name text,
    status text NOT NULL CONSTRAINT ck_tasks_status
        CHECK (status IN ('queued', 'assigned', 'dispatched', 'done', 'failed', 'cancelled')),
    priority integer NOT NULL CONSTRAINT ck_tasks_priority CHECK (priority BETWEEN -1000 AND 1000),
    max_attempts integer NOT NULL CONSTRAINT ck_tasks_max_attempts CHECK (max_attempts BETWEEN 1 AND 100),
    attempt_count integer NOT NULL DEFAULT 0
        CONSTRAINT ck_tasks_attempt_count CHECK (attempt_count BETWEEN 0 AND max_attempts),
    lease_ttl_s integer NOT NULL CONSTRAINT ck_tasks_lease_ttl CHECK (lease_ttl_s BETWEEN 1 AND 3600),
    selector_labels jsonb NOT NULL DEFAULT '{{}}',
    selector_device_id text,
    plan jsonb NOT NULL,
    metadata jsonb NOT NULL DEFAULT '{{}}',
    idempotency_key text CONSTRAINT uq_tasks_idempotency_key UNIQUE,
    created_at timestamptz NOT NULL,
    updated_at timestamptz NOT NULL,
    reason text,
    result jsonb,
    -- events of this task so far: the next event's seq is event_seq + 1
    event_seq integer NOT NULL DEFAULT 0,
    CONSTRAINT ck_tasks_in_flight_has_attempt CHECK (status NOT IN ('assigned', 'dispatched') OR attempt_count >= 1)
);
CREATE INDEX ix_tasks_queue ON tasks (priority DESC, created_at, task_id) WHERE status = 'queued';
CREATE INDEX ix_tasks_listing ON tasks (created_at DESC, task_id DESC);
CREATE INDEX ix_tasks_status_listing ON tasks (status, created_at DESC, task_id DESC);

CREATE TABLE attempts (
    task_id uuid NOT NULL CONSTRAINT fk_attempts_task REFERENCES tasks (task_id),
    attempt integer NOT NULL CONSTRAINT ck_attempts_attempt CHECK (attempt >= 1),
    prev_attempt integer GENERATED ALWAYS AS (NULLIF(attempt - 1, 0)) STORED,
    lease_id uuid NOT NULL CONSTRAINT uq_attempts_lease_id UNIQUE,
    host_id text NOT NULL CONSTRAINT fk_attempts_host REFERENCES hosts (host_id),
    device_id text NOT NULL CONSTRAINT fk_attempts_device REFERENCES devices (device_id),
    status text NOT NULL CONSTRAINT ck_attempts_status
        CHECK (status IN ('active', 'expired', 'done', 'failed', 'cancelled')),
    assigned_at timestamptz NOT NULL,
    dispatched_at timestamptz,
    expires_at timestamptz NOT NULL,
    ended_at timestamptz,
    end_reason text CONSTRAINT ck_attempts_end_reason
        CHECK (end_reason IN ('done', 'failed', 'cancelled', 'lease_expired')),
    progress jsonb,
    report_reason text,
    result jsonb,
    CONSTRAINT pk_attempts PRIMARY KEY (task_id, attempt),
    CONSTRAINT fk_attempts_previous FOREIGN KEY (task_id, prev_attempt) REFERENCES attempts (task_id, attempt),
    CONSTRAINT uq_attempts_reservation_key UNIQUE (task_id, attempt, device_id, status),
    CONSTRAINT ck_attempts_ended CHECK ((status = 'active') = (ended_at IS NULL)),
    CONSTRAINT ck_attempts_end_reason_iff_ended CHECK ((status = 'active') = (end_reason IS NULL)),
    CONSTRAINT ck_attempts_end_reason_matches CHECK (
        status = 'active'
        OR (status = 'expired' AND end_reason = 'lease_expired')
        OR (status = end_reason))
);
CREATE UNIQUE INDEX uq_attempts_one_active_per_task ON attempts (task_id) WHERE status = 'active';
CREATE INDEX ix_attempts_active_expiry ON attempts (expires_at) WHERE status = 'active';
CREATE INDEX ix_attempts_device ON attempts (device_id, ended_at);

CREATE TABLE reservations (
    task_id uuid NOT NULL,
    attempt integer NOT NULL,
    device_id text NOT NULL,
    -- follows the attempt's status through the cascading foreign key below
    attempt_status text NOT NULL,
    created_at timestamptz NOT NULL,
    CONSTRAINT pk_reservations PRIMARY KEY (task_id, attempt),
    CONSTRAINT fk_reservations_attempt FOREIGN KEY (task_id, attempt, device_id, attempt_status)
        REFERENCES attempts (task_id, attempt, device_id, status) ON UPDATE CASCADE
);
CREATE UNIQUE INDEX uq_reservations_one_active_per_device ON reservations (device_id)
    WHERE attempt_status = 'active';

CREATE TABLE cancel_requests (
    task_id uuid NOT NULL,
    attempt integer NOT NULL,
    requested_at timestamptz NOT NULL,
    reason text,
    CONSTRAINT pk_cancel_requests PRIMARY KEY (task_id, attempt),
    CONSTRAINT fk_cancel_requests_attempt FOREIGN KEY (task_id, attempt) REFERENCES attempts (task_id, attempt)
);

CREATE TABLE outbox (
    id bigserial PRIMARY KEY,
    subject text NOT NULL,
    msg_id text NOT NULL CONSTRAINT uq_outbox_msg_id UNIQUE,
    payload jsonb NOT NULL,
    headers jsonb NOT NULL DEFAULT '{{}}',
    created_at timestamptz NOT NULL,
    sent_at timestamptz
);
CREATE INDEX ix_outbox_unsent ON outbox (id) WHERE sent_at IS NULL;
"""

DOWNGRADE = """
DROP TABLE outbox;
DROP TABLE cancel_requests;
DROP TABLE reservations;
DROP TABLE attempts;
DROP TABLE tasks;
DROP TABLE devices;
DROP TABLE hosts;
"""


def upgrade() -> None:
    """Create the schema."""
    for statement in UPGRADE.split(";\n"):
        if statement.strip():
            op.execute(statement)


def downgrade() -> None:
    """Drop the schema (data is lost)."""
    for statement in DOWNGRADE.split(";\n"):
        if statement.strip():
            op.execute(statement)
