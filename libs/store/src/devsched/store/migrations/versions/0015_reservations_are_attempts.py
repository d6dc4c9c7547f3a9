"""A device's reservation is its active attempt (issue 10): one row and one index, no table kept in step.

The `reservations` table mirrored every attempt (task, attempt, device and status), its status kept equal
to the attempt's by an `ON UPDATE CASCADE` foreign key, so that a partial unique index could say "one
active reservation per device". Each assignment paid a second row, two index entries and a foreign-key
check; each end of an attempt paid the cascade's update (a new row version, its index entries and the
check again); and `attempts` carried `uq_attempts_reservation_key`, a four-column unique index that existed
only as that key's target. Now the attempts themselves hold the rule: `uq_attempts_one_active_per_device`
is a partial unique index on the active attempts' device, the same guarantee, enforced on the row that is
written anyway. A renewal stays a HOT update (it changes neither the device nor the status).

`reservations` stays as a view of the attempts, with the same columns, for operators and older readers;
"a reservation is active exactly while its attempt is" is now true by definition. During a rolling update
an older release still inserts into it alongside its attempt: an INSTEAD OF trigger takes that insert and
does nothing (the attempt row is the reservation). An UPDATE or DELETE of it is refused with an error that
says to change the attempt (a view this simple would otherwise write through to the attempts).
`devsched_prune` no longer deletes from it.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-04
"""

import importlib
from collections.abc import Sequence

from alembic import op

from devsched.store.migrations import execute_script

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

UPGRADE = """
CREATE UNIQUE INDEX uq_attempts_one_active_per_device ON attempts (device_id) WHERE status = 'active';

DROP TABLE reservations;

ALTER TABLE attempts DROP CONSTRAINT uq_attempts_reservation_key;

CREATE VIEW reservations AS
    SELECT task_id, attempt, device_id, status AS attempt_status, assigned_at AS created_at FROM attempts;

CREATE FUNCTION devsched_reservation_insert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    -- an older release writes a reservation beside the attempt it inserts: the attempt is the reservation
    RETURN NEW;
END
$$;

CREATE TRIGGER tg_reservations_insert INSTEAD OF INSERT ON reservations
    FOR EACH ROW EXECUTE FUNCTION devsched_reservation_insert();

CREATE FUNCTION devsched_reservation_refused() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'a reservation is its attempt: % it through the attempt', lower(TG_OP)
        USING ERRCODE = 'feature_not_supported';
END
$$;

CREATE TRIGGER tg_reservations_refused INSTEAD OF UPDATE OR DELETE ON reservations
    FOR EACH ROW EXECUTE FUNCTION devsched_reservation_refused()
"""

DOWNGRADE = """
DROP VIEW reservations;

DROP FUNCTION devsched_reservation_insert();

DROP FUNCTION devsched_reservation_refused();

ALTER TABLE attempts ADD CONSTRAINT uq_attempts_reservation_key UNIQUE (task_id, attempt, device_id, status);

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

INSERT INTO reservations (task_id, attempt, device_id, attempt_status, created_at)
    SELECT task_id, attempt, device_id, status, assigned_at FROM attempts;

CREATE UNIQUE INDEX uq_reservations_one_active_per_device ON reservations (device_id)
    WHERE attempt_status = 'active';

DROP INDEX uq_attempts_one_active_per_device
"""

#: `devsched_prune` as migration 0007 left it, without the reservations' DELETE (a view now).
_PRUNE_0007: str = importlib.import_module("devsched.store.migrations.versions.0007_artifacts").CREATE_PRUNE
_RESERVATIONS_DELETE = "    DELETE FROM public.reservations WHERE task_id = ANY(ids);\n"
assert _RESERVATIONS_DELETE in _PRUNE_0007
CREATE_PRUNE = _PRUNE_0007.replace(_RESERVATIONS_DELETE, "", 1)


def upgrade() -> None:
    """One active attempt per device as a partial unique index; reservations a view; pruning without them."""
    execute_script(UPGRADE)
    op.execute(CREATE_PRUNE)


def downgrade() -> None:
    """The reservations table again, filled from the attempts, and pruning as in 0007."""
    execute_script(DOWNGRADE)
    op.execute(_PRUNE_0007)
