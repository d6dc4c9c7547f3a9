"""A device's consecutive infrastructure failures, counted where an attempt ends, and its quarantine.

Applied in the transaction that ends the attempt (a report, a release, a lease expiry) with core's rule
(`devsched.core.health`): the device row is locked (`FOR UPDATE`; placement's statements lock devices
with SKIP LOCKED, so nothing waits on this) and written only when the count changes. A quarantined device
is out of `candidates.free()` until a passing health check or an operator returns it (`returned`).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from devsched.core.health import DeviceOutcome, quarantine_reason, tally

log = logging.getLogger("devsched.store.quarantine")

_RESET = text("UPDATE devices SET infra_failures = 0 WHERE device_id = :device_id AND infra_failures > 0")

#: The devices of a batch, locked in one order (two sweeps or reports never wait on each other in a cycle).
_READ = text(
    """
    SELECT device_id, infra_failures, quarantined_at IS NOT NULL AS quarantined FROM devices
    WHERE device_id = ANY(CAST(:device_ids AS text[])) ORDER BY device_id FOR UPDATE
    """
)

_COUNT = text(
    """
    UPDATE devices d
    SET infra_failures = u.count,
        quarantined_at = CASE WHEN u.quarantine THEN CAST(:now AS timestamptz) ELSE d.quarantined_at END,
        quarantine_reason = CASE WHEN u.quarantine THEN u.reason ELSE d.quarantine_reason END
    FROM unnest(CAST(:device_ids AS text[]), CAST(:counts AS int[]), CAST(:quarantines AS boolean[]),
                CAST(:reasons AS text[])) AS u(id, count, quarantine, reason)
    WHERE d.device_id = u.id
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
    return bool(await record_failures(conn, now, [device_id], last, threshold=threshold))


async def record_failures(
    conn: AsyncConnection, now: datetime, device_ids: Sequence[str], last: str, *, threshold: int
) -> list[str]:
    """Count one infrastructure failure (cause `last`) per entry of `device_ids` (repeats count again).

    Two statements whatever the number of devices (a sweep of thousands of expired leases stays a batch):
    the devices are read and locked in id order, counted by core's rule, and written at once. Returns the
    devices these failures quarantined.
    """
    occurrences = Counter(device_ids)
    rows = (await conn.execute(_READ, {"device_ids": sorted(occurrences)})).all()
    ids, counts, quarantines, reasons = [], [], [], []
    for row in rows:
        count, quarantined, quarantine = row.infra_failures, row.quarantined, False
        for _ in range(occurrences[row.device_id]):
            counted = tally(count, DeviceOutcome.INFRA_FAILURE, threshold, quarantined=quarantined)
            count, quarantine = counted.infra_failures, quarantine or counted.quarantine
            quarantined = quarantined or counted.quarantine
        ids.append(row.device_id)
        counts.append(count)
        quarantines.append(quarantine)
        reasons.append(quarantine_reason(count, last))
    if ids:
        params = {"device_ids": ids, "counts": counts, "quarantines": quarantines, "reasons": reasons, "now": now}
        await conn.execute(_COUNT, params)
    quarantined_now = [i for i, q in zip(ids, quarantines, strict=True) if q]
    for device_id, reason in zip(ids, reasons, strict=True):
        if device_id in quarantined_now:
            log.warning("device quarantined", extra={"device_id": device_id, "reason": reason})
    return quarantined_now


async def quarantine(conn: AsyncConnection, now: datetime, device_id: str, reason: str) -> None:
    """Take `device_id` out of service now (kept: the first quarantine's time and reason)."""
    await conn.execute(_QUARANTINE, {"device_id": device_id, "now": now, "reason": reason})
    log.warning("device quarantined", extra={"device_id": device_id, "reason": reason})


async def return_device(conn: AsyncConnection, now: datetime, device_id: str, *, checked: bool) -> None:
    """Return `device_id` to service: its count back to 0, its quarantine lifted (`checked`: by a health check)."""
    await conn.execute(_RETURN, {"device_id": device_id, "now": now, "checked": checked})
