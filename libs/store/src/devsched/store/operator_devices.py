"""What operators do to a device besides draining it: free it from its host, and pin labels on it.

Both are audited (`audit`) in their own transaction. A device belongs to the host that first registered
it until an operator frees it (`forget_device`); then the next host that registers it owns it. Operator
labels are kept apart from the host's and win over them (`hosts.effective_labels`): a host's registration
can neither override nor remove them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from devsched.core.errors import Conflict, NotFound
from devsched.core.views import DeviceView, ForgottenDevice
from devsched.store import audit
from devsched.store.hosts import ONE_DEVICE, device_busy, device_view, effective_labels

_OWNER = text(
    f"""
    SELECT d.device_id, d.host_id, d.freed_at, {device_busy("d")} AS busy,
           d.available_after IS NOT NULL AND d.available_after > :now AS in_grace
    FROM devices d WHERE d.device_id = :id
    FOR UPDATE OF d
    """
)
_FREE = text("UPDATE devices SET freed_at = :now, registered = false, updated_at = :now WHERE device_id = :id")


async def forget_device(conn: AsyncConnection, now: datetime, device_id: str, reason: str) -> ForgottenDevice:
    """Free `device_id` from its host: the next host that registers it owns it.

    Its drain and its operator labels stay (they are the operators' own, undone as they were done); its
    former host gets no new work on it.

    Refused while it runs an attempt, or while its grace after an expired one lasts (a lost agent may still
    be using it). Forgetting a device already freed answers the earlier act, and records nothing new.

    Raises:
        NotFound: no such device.
        Conflict: it runs an attempt, or is in its grace.
    """
    row = (await conn.execute(_OWNER, {"id": device_id, "now": now})).one_or_none()
    if row is None:
        raise NotFound(f"no device {device_id}", device_id=device_id)
    if row.busy or row.in_grace:
        why = "runs an attempt" if row.busy else "is in its grace after an expired attempt"
        raise Conflict(f"device {device_id} {why}; forget it once it is idle", device_id=device_id)
    if row.freed_at is not None:
        earlier = (await conn.execute(_LAST_FORGET, {"id": device_id})).one()
        return ForgottenDevice(device_id, row.host_id, row.freed_at, earlier.reason or "", earlier.actor, earlier.id)
    await conn.execute(_FREE, {"id": device_id, "now": now})
    audit_id = await audit.record(conn, now, device_id, "forget", reason=reason, details={"host_id": row.host_id})
    return ForgottenDevice(device_id, row.host_id, now, reason, audit.OPERATOR_API, audit_id)


_LAST_FORGET = text(
    """
    SELECT id, actor, reason FROM device_audit WHERE device_id = :id AND action = 'forget'
    ORDER BY at DESC, id DESC LIMIT 1
    """
)

_LABEL = text(
    f"""
    UPDATE devices
    SET operator_labels = (operator_labels - CAST(:unset AS text[])) || CAST(:set AS jsonb),
        labels = {effective_labels(operator="((operator_labels - CAST(:unset AS text[])) || CAST(:set AS jsonb))")},
        updated_at = :now
    WHERE device_id = :id
    """
)


async def label_device(
    conn: AsyncConnection, now: datetime, device_id: str, set_labels: Mapping[str, str], unset: Sequence[str]
) -> DeviceView:
    """Pin `set_labels` on the device and unpin the keys `unset`; the device after the change.

    An unpinned key shows the host's value again, if its host asserts one. The caller checks that no key is
    both set and unset, and that none is reserved.

    Raises:
        NotFound: no such device.
    """
    params = {"id": device_id, "set": json.dumps(dict(set_labels)), "unset": list(unset), "now": now}
    if (await conn.execute(_LABEL, params)).rowcount == 0:
        raise NotFound(f"no device {device_id}", device_id=device_id)
    await audit.record(conn, now, device_id, "label", details={"set": dict(set_labels), "unset": sorted(unset)})
    return device_view((await conn.execute(ONE_DEVICE, {"id": device_id, "now": now})).one())
