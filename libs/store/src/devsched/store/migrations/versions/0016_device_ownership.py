"""Device ownership and operator labels: a device id is its first host's until an operator frees it.

- `devices.freed_at`: set by an operator's `devices.forget`; until then the device belongs to `host_id`,
  and only that host may register it. The trigger `tg_devices_owner_kept` refuses any change of `host_id`
  while `freed_at` is null, whatever code writes (an older release's registration included).
- `devices.host_labels`: what the host asserted at its latest registration (its action labels included);
  `devices.operator_labels`: what operators set (`devices.label`). `labels` stays the effective labels
  that selectors, health checks and views read (the host's overlaid by the operator's), so every query
  that matches labels keeps reading one column; `ck_devices_operator_labels_win` makes the database refuse
  effective labels that lose an operator's key or value.
- `device_audit`: one row per operator act on a device (forget, label), written in the act's transaction.

Existing devices keep their host; their labels become their host labels. During a rolling update an
older release still registers its devices (its write of `labels` is refused only where an operator has
pinned a key, which needs this release); a device it registers for the first time gets empty host labels
until its next registration by this release.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-07
"""

from collections.abc import Sequence

from devsched.store.migrations import execute_script

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

UPGRADE = """
ALTER TABLE devices
    ADD COLUMN host_labels jsonb NOT NULL DEFAULT '{}'
        CONSTRAINT ck_devices_host_labels_object CHECK (jsonb_typeof(host_labels) = 'object'),
    ADD COLUMN operator_labels jsonb NOT NULL DEFAULT '{}'
        CONSTRAINT ck_devices_operator_labels_object CHECK (jsonb_typeof(operator_labels) = 'object'),
    ADD COLUMN freed_at timestamptz;

UPDATE devices SET host_labels = labels;

ALTER TABLE devices ADD CONSTRAINT ck_devices_operator_labels_win CHECK (labels @> operator_labels);

CREATE FUNCTION devsched_device_owner_kept() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.host_id IS DISTINCT FROM OLD.host_id AND OLD.freed_at IS NULL THEN
        RAISE EXCEPTION 'a device belongs to its host until an operator frees it (devices.forget)'
            USING ERRCODE = 'unique_violation', CONSTRAINT = 'tg_devices_owner_kept';
    END IF;
    RETURN NEW;
END
$$;

REVOKE ALL ON FUNCTION devsched_device_owner_kept() FROM PUBLIC;

CREATE TRIGGER tg_devices_owner_kept BEFORE UPDATE OF host_id ON devices
    FOR EACH ROW EXECUTE FUNCTION devsched_device_owner_kept();

CREATE TABLE device_audit (
    id bigserial PRIMARY KEY,
    at timestamptz NOT NULL,
    device_id text NOT NULL,
    action text NOT NULL CONSTRAINT ck_device_audit_action CHECK (action IN ('forget', 'label')),
    actor text NOT NULL,
    reason text,
    details jsonb NOT NULL DEFAULT '{}'
        CONSTRAINT ck_device_audit_details_object CHECK (jsonb_typeof(details) = 'object')
);

CREATE INDEX ix_device_audit_device ON device_audit (device_id, at)
"""

DOWNGRADE = """
DROP TABLE device_audit;

DROP TRIGGER tg_devices_owner_kept ON devices;

DROP FUNCTION devsched_device_owner_kept();

ALTER TABLE devices
    DROP CONSTRAINT ck_devices_operator_labels_win,
    DROP COLUMN freed_at,
    DROP COLUMN operator_labels,
    DROP COLUMN host_labels
"""


def upgrade() -> None:
    """Add ownership, the host's and the operator's labels, the audit table and the owner trigger."""
    execute_script(UPGRADE)


def downgrade() -> None:
    """Drop them; devices keep their effective labels (operator keys included) and their host."""
    execute_script(DOWNGRADE)
