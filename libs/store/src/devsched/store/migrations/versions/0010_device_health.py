"""Device health (issue 13 items 1 and 2): consecutive infrastructure failures, quarantine, health checks.

- `devices.infra_failures` counts the device's consecutive infrastructure failures (`devsched.core.health`);
  `quarantined_at` (null: not quarantined) and `quarantine_reason` say when and why the scheduler took it
  out of service; `health_checked_at` when a health check last passed on it.
- `health_checks`: the operators' health-check plans, each for the devices its selector labels match,
  run every `interval_s` seconds (and on a quarantined device).
- `tasks.kind`: `user` (what users submit) or `health` (a health check the scheduler submitted for
  `health_device_id`); a partial unique index keeps at most one open health task per device.

The downgrade drops them: health tasks become ordinary tasks of the older release.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-12
"""

from collections.abc import Sequence

from devsched.store.migrations import execute_script

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

UPGRADE = """
ALTER TABLE devices
    ADD COLUMN infra_failures integer NOT NULL DEFAULT 0,
    ADD COLUMN quarantined_at timestamptz,
    ADD COLUMN quarantine_reason text,
    ADD COLUMN health_checked_at timestamptz,
    ADD CONSTRAINT ck_devices_infra_failures CHECK (infra_failures >= 0);

CREATE TABLE health_checks (
    selector_labels jsonb PRIMARY KEY,
    plan jsonb NOT NULL,
    interval_s double precision NOT NULL,
    created_at timestamptz NOT NULL,
    updated_at timestamptz NOT NULL,
    CONSTRAINT ck_health_checks_selector_object CHECK (jsonb_typeof(selector_labels) = 'object'),
    CONSTRAINT ck_health_checks_plan_object CHECK (jsonb_typeof(plan) = 'object'),
    CONSTRAINT ck_health_checks_interval CHECK (interval_s > 0)
);

ALTER TABLE tasks
    ADD COLUMN kind text NOT NULL DEFAULT 'user',
    ADD COLUMN health_device_id text,
    ADD CONSTRAINT ck_tasks_kind CHECK (kind IN ('user', 'health')),
    ADD CONSTRAINT ck_tasks_health_device CHECK ((kind = 'health') = (health_device_id IS NOT NULL));

CREATE UNIQUE INDEX uq_tasks_open_health ON tasks (health_device_id)
    WHERE kind = 'health' AND status IN ('queued', 'assigned', 'dispatched')
"""

DOWNGRADE = """
DROP INDEX uq_tasks_open_health;

ALTER TABLE tasks
    DROP CONSTRAINT ck_tasks_health_device,
    DROP CONSTRAINT ck_tasks_kind,
    DROP COLUMN health_device_id,
    DROP COLUMN kind;

DROP TABLE health_checks;

ALTER TABLE devices
    DROP CONSTRAINT ck_devices_infra_failures,
    DROP COLUMN health_checked_at,
    DROP COLUMN quarantine_reason,
    DROP COLUMN quarantined_at,
    DROP COLUMN infra_failures
"""


def upgrade() -> None:
    """Add the devices' health columns, the health checks, and the tasks' kind."""
    execute_script(UPGRADE)


def downgrade() -> None:
    """Drop them."""
    execute_script(DOWNGRADE)
