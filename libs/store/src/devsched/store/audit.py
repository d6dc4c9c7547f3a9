"""The operators' acts on devices, kept durably: one `device_audit` row per act, in the act's transaction.

There are no operator identities yet: `actor` records what there is, the endpoint that was called. The
row may hold label values (an operator's, not secrets); the scheduler's log line of the act, written
once it has committed, names the device and the keys, never a value or a reason.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

#: The actor of every act through the operator API (until operators have identities).
OPERATOR_API = "operator-api"

_INSERT = text(
    """
    INSERT INTO device_audit (at, device_id, action, actor, reason, details)
    VALUES (:at, :device_id, :action, :actor, :reason, CAST(:details AS jsonb))
    RETURNING id
    """
)


async def record(
    conn: AsyncConnection,
    now: datetime,
    device_id: str,
    action: str,
    *,
    actor: str = OPERATOR_API,
    reason: str | None = None,
    details: Mapping[str, Any] | None = None,
) -> int:
    """Write the audit row of `action` (`forget`, `label`) on `device_id`; returns its id."""
    params = {
        "at": now, "device_id": device_id, "action": action, "actor": actor, "reason": reason,
        "details": json.dumps(dict(details or {})),
    }  # fmt: skip
    return int((await conn.execute(_INSERT, params)).scalar_one())
