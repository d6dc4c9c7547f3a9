"""A device's consecutive infrastructure failures, counted where an attempt ends, and its quarantine.

Applied in the transaction that ends the attempt (a report, a release, a lease expiry) with core's rule
(`devsched.core.health`): the device row is locked (`FOR UPDATE`; placement's statements lock devices
with SKIP LOCKED, so nothing waits on this) and written only when the count changes. A quarantined device
is out of `candidates.free()` until a passing health check or an operator returns it (`return_device`,
`returning`). Each quarantine and each return of a quarantined device queues a `DeviceEvent` in the
transaction's outbox, so the event commits with the change.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from devsched.core.events import DeviceEvent, DeviceEventCause, DeviceEventKind
from devsched.core.health import DeviceOutcome, quarantine_reason, tally
from devsched.store.outbox import Outbox

log = logging.getLogger("devsched.store.quarantine")

_RESET = text("UPDATE devices SET infra_failures = 0 WHERE device_id = :device_id AND infra_failures > 0")

#: The devices of a batch, locked in one order (two sweeps or reports never wait on each other in a cycle).
_READ = text(
    """
    SELECT device_id, host_id, infra_failures, quarantined_at IS NOT NULL AS quarantined, quarantine_reason
    FROM devices WHERE device_id = ANY(CAST(:device_ids AS text[])) ORDER BY device_id FOR UPDATE
    """
)

#: Back in service: a passing health check (`checked`) or an operator's return.
_RETURN = text(
    """
    UPDATE devices
    SET infra_failures = 0, quarantined_at = NULL, quarantine_reason = NULL,
        health_checked_at = CASE WHEN :checked THEN CAST(:now AS timestamptz) ELSE health_checked_at END
    WHERE device_id = :device_id
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


#: The quarantined devices among those named or on a host, locked before an operator returns them.
_QUARANTINED = text(
    """
    SELECT device_id, host_id, quarantine_reason FROM devices
    WHERE quarantined_at IS NOT NULL
      AND (device_id = ANY(CAST(:device_ids AS text[])) OR (host_id = CAST(:host_id AS text) AND registered))
    ORDER BY device_id FOR UPDATE
    """
)


def _event(
    kind: DeviceEventKind, row: Any, now: datetime, by: DeviceEventCause, infra_failures: int, reason: str | None
) -> DeviceEvent:
    return DeviceEvent(
        event=kind, device_id=row.device_id, host_id=row.host_id, at=now, by=by, infra_failures=infra_failures,
        reason=reason,
    )  # fmt: skip


async def record(
    conn: AsyncConnection,
    now: datetime,
    outbox: Outbox,
    device_id: str,
    outcome: DeviceOutcome,
    last: str,
    *,
    threshold: int,
) -> bool:
    """Count `outcome` of an attempt that ended on `device_id` (`last`: the failure's cause, for the reason).

    Returns whether this outcome quarantined the device (its event is queued in `outbox`).
    """
    if outcome is DeviceOutcome.NEUTRAL:
        return False
    if outcome is DeviceOutcome.HEALTHY:
        await conn.execute(_RESET, {"device_id": device_id})
        return False
    return bool(await record_failures(conn, now, outbox, [device_id], last, threshold=threshold))


@dataclass(frozen=True, slots=True)
class Failures:
    """The devices' new failure counts, as core's rule tallied them: what to write, whom it quarantined."""

    #: The devices read, in id order, with what to write to each (the parameters of `COUNTED`).
    device_ids: list[str]
    counts: list[int]
    quarantines: list[bool]
    reasons: list[str]
    grace: list[datetime | None]
    #: The rows read (for the events).
    rows: Sequence[Any]

    def params(self) -> dict[str, Any]:
        """The parameters of `COUNTED` (with `now`)."""
        return {
            "device_ids": self.device_ids, "counts": self.counts, "quarantines": self.quarantines,
            "qreasons": self.reasons, "until": self.grace,
        }  # fmt: skip

    def queue(self, now: datetime, outbox: Outbox) -> list[str]:
        """Queue a `device_quarantined` event of each device quarantined now; returns them."""
        quarantined_now = []
        for row, count, quarantine, reason in zip(self.rows, self.counts, self.quarantines, self.reasons, strict=True):
            if quarantine:
                quarantined_now.append(row.device_id)
                log.warning("device quarantined", extra={"device_id": row.device_id, "reason": reason})
                event = _event(DeviceEventKind.QUARANTINED, row, now, DeviceEventCause.INFRA_FAILURES, count, reason)
                outbox.add(event)
        return quarantined_now


#: SQL: the devices' counts written (`Failures.params`, and `now`), as a statement or a CTE of one.
COUNTED = """
    UPDATE devices d
    SET infra_failures = f.count,
        quarantined_at = CASE WHEN f.quarantine THEN CAST(:now AS timestamptz) ELSE d.quarantined_at END,
        quarantine_reason = CASE WHEN f.quarantine THEN f.reason ELSE d.quarantine_reason END,
        available_after = CASE WHEN f.grace IS NULL THEN d.available_after
                               ELSE GREATEST(COALESCE(d.available_after, f.grace), f.grace) END
    FROM unnest(CAST(:device_ids AS text[]), CAST(:counts AS int[]), CAST(:quarantines AS boolean[]),
                CAST(:qreasons AS text[]), CAST(:until AS timestamptz[])) AS f(id, count, quarantine, reason, grace)
    WHERE d.device_id = f.id
"""
_COUNT = text(COUNTED)


async def lock(conn: AsyncConnection, device_ids: Sequence[str]) -> Sequence[Any]:
    """Lock and read the devices named (in id order)."""
    return (await conn.execute(_READ, {"device_ids": sorted(set(device_ids))})).all()


def tally_failures(
    rows: Sequence[Any],
    device_ids: Sequence[str],
    last: str,
    *,
    threshold: int,
    grace: Mapping[str, datetime] | None = None,
) -> Failures:
    """Count one infrastructure failure (cause `last`) per entry of `device_ids` by core's rule.

    Repeats count again; `rows`: the devices, locked and read (`lock`); `grace`: when each may be used
    again at the earliest.
    """
    occurrences = Counter(device_ids)
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
    until: list[datetime | None] = [grace.get(i) for i in ids] if grace else [None] * len(ids)
    return Failures(ids, counts, quarantines, reasons, until, rows)


async def record_failures(
    conn: AsyncConnection,
    now: datetime,
    outbox: Outbox,
    device_ids: Sequence[str],
    last: str,
    *,
    threshold: int,
    grace: Mapping[str, datetime] | None = None,
) -> list[str]:
    """Count one infrastructure failure (cause `last`) per entry of `device_ids` (repeats count again).

    Two statements whatever the number of devices: the devices are read and locked in id order, counted by
    core's rule, and written at once. Returns the devices these failures quarantined; a `device_quarantined`
    event of each is queued in `outbox`. `grace`: when each device may be used again at the earliest, written
    with the count, so that a device row is written once. (A sweep writes the counts with its tasks' statement:
    `lock`, `tally_failures`, `COUNTED`.)
    """
    failures = tally_failures(await lock(conn, device_ids), device_ids, last, threshold=threshold, grace=grace)
    if failures.device_ids:
        await conn.execute(_COUNT, {**failures.params(), "now": now})
    return failures.queue(now, outbox)


async def quarantine(conn: AsyncConnection, now: datetime, outbox: Outbox, device_id: str, reason: str) -> bool:
    """Take `device_id` out of service now (kept: the first quarantine's time and reason).

    Returns whether it was in service; only then is a `device_quarantined` event queued in `outbox`.
    """
    row = (await conn.execute(_READ, {"device_ids": [device_id]})).one_or_none()
    if row is None or row.quarantined:
        return False
    await conn.execute(_QUARANTINE, {"device_id": device_id, "now": now, "reason": reason})
    log.warning("device quarantined", extra={"device_id": device_id, "reason": reason})
    outbox.add(_event(DeviceEventKind.QUARANTINED, row, now, DeviceEventCause.HEALTH_CHECK, row.infra_failures, reason))
    return True


async def return_device(conn: AsyncConnection, now: datetime, outbox: Outbox, device_id: str, *, checked: bool) -> bool:
    """Return `device_id` to service: its count back to 0, its quarantine lifted (`checked`: by a health check).

    Returns whether it was quarantined; only then is a `device_returned` event queued in `outbox`.
    """
    row = (await conn.execute(_READ, {"device_ids": [device_id]})).one_or_none()
    await conn.execute(_RETURN, {"device_id": device_id, "now": now, "checked": checked})
    if row is None or not row.quarantined:
        return False
    by = DeviceEventCause.HEALTH_CHECK if checked else DeviceEventCause.OPERATOR
    outbox.add(_event(DeviceEventKind.RETURNED, row, now, by, 0, row.quarantine_reason))
    return True


async def returning(
    conn: AsyncConnection,
    now: datetime,
    outbox: Outbox,
    *,
    device_ids: Sequence[str] = (),
    host_id: str | None = None,
) -> list[str]:
    """Queue a `device_returned` event (by the operator) for each quarantined device an operator returns.

    `device_ids`, or every registered device of `host_id`: they are locked until the caller's statement
    lifts their quarantine. Returns the quarantined ones.
    """
    rows = (await conn.execute(_QUARANTINED, {"device_ids": list(device_ids), "host_id": host_id})).all()
    for row in rows:
        outbox.add(_event(DeviceEventKind.RETURNED, row, now, DeviceEventCause.OPERATOR, 0, row.quarantine_reason))
    return [row.device_id for row in rows]
