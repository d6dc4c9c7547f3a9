"""A device's consecutive infrastructure failures, counted where an attempt ends, and its quarantine.

Applied in the transaction that ends the attempt (a report, a release, a lease expiry) with core's rule
(`devsched.core.health`): the device row is locked (`FOR UPDATE`; placement's statements lock devices
with SKIP LOCKED, so nothing waits on this) and written only when the count changes. A quarantined device
is out of `candidates.free()` until a passing health check or an operator returns it (`returned`).
"""

from __future__ import annotations

import logging
from datetime import datetime

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from devsched.core.health import DeviceOutcome, quarantine_reason, tally

log = logging.getLogger("devsched.store.quarantine")

_RESET = text("UPDATE devices SET infra_failures = 0 WHERE device_id = :device_id AND infra_failures > 0")

_READ = text(
    """
    SELECT infra_failures, quarantined_at IS NOT NULL AS quarantined FROM devices
    WHERE device_id = :device_id FOR UPDATE
    """
)

_COUNT = text(
    """
    UPDATE devices
    SET infra_failures = :count,
        quarantined_at = CASE WHEN :quarantine THEN CAST(:now AS timestamptz) ELSE quarantined_at END,
        quarantine_reason = CASE WHEN :quarantine THEN CAST(:reason AS text) ELSE quarantine_reason END
    WHERE device_id = :device_id
    """
)

#: Back in service: a passing health check (`checked`) or an operator's return.
_RETURN = text(
    """
    UPDATE devices
    SET infra_failures = 0, quarantined_at = NULL, quarantine_reason = NULL,
        health_checked_at = CASE WHEN :checked THEN CAST(:now AS timestamptz) ELSE health_checked_at END
    WHERE device_id = :device_id
    RETURNING quarantined_at IS NULL AS returned
    """
)

#: Out of service at once (a failed health check), whatever the count.
_QUARANTINE = text(
    """
    UPDATE devices
    SET quarantined_at = COALESCE(quarantined_at, CAST(:now AS timestamptz)),
        quarantine_reason = COALESCE(quarantine_reason, CAST(:reason AS text))
    WHERE device_id = :device_id
    """
)


async def record(
    conn: AsyncConnection, now: datetime, device_id: str, outcome: DeviceOutcome, last: str, *, threshold: int
) -> bool:
    """Count `outcome` of an attempt that ended on `device_id` (`last`: the failure's cause, for the reason).

    Returns whether this outcome quarantined the device.
    """
    if outcome is DeviceOutcome.NEUTRAL:
        return False
    if outcome is DeviceOutcome.HEALTHY:
        await conn.execute(_RESET, {"device_id": device_id})
        return False
    row = (await conn.execute(_READ, {"device_id": device_id})).one_or_none()
    if row is None:
        return False
    counted = tally(row.infra_failures, outcome, threshold, quarantined=row.quarantined)
    reason = quarantine_reason(counted.infra_failures, last)
    params = {"device_id": device_id, "count": counted.infra_failures, "quarantine": counted.quarantine}
    await conn.execute(_COUNT, {**params, "now": now, "reason": reason})
    if counted.quarantine:
        log.warning("device quarantined", extra={"device_id": device_id, "reason": reason})
    return counted.quarantine


async def quarantine(conn: AsyncConnection, now: datetime, device_id: str, reason: str) -> None:
    """Take `device_id` out of service now (kept: the first quarantine's time and reason)."""
    await conn.execute(_QUARANTINE, {"device_id": device_id, "now": now, "reason": reason})
    log.warning("device quarantined", extra={"device_id": device_id, "reason": reason})


async def return_device(conn: AsyncConnection, now: datetime, device_id: str, *, checked: bool) -> None:
    """Return `device_id` to service: its count back to 0, its quarantine lifted (`checked`: by a health check)."""
    await conn.execute(_RETURN, {"device_id": device_id, "now": now, "checked": checked})
