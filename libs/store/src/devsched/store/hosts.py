"""Hosts and devices: registration, heartbeats, listing, and draining.

A device id belongs to the host that first registered it until an operator frees it (`operator_devices`);
its effective labels, which selectors match, are its host's overlaid by the operator's (`effective_labels`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from devsched.core.actions import action_labels, visible_labels
from devsched.core.errors import DeviceConflict, NotFound
from devsched.core.status import AttemptStatus, DeviceState
from devsched.core.views import ActionInfo, DeviceView, HostView
from devsched.store import quarantine
from devsched.store.liveness import host_online
from devsched.store.outbox import Outbox
from devsched.store.views import ActionSpec, DeviceSpec


def device_busy(devices: str = "d") -> str:
    """The one SQL condition "the device runs an attempt", for the `devices` row aliased `devices`.

    An active attempt (the device's reservation, one at most: `uq_attempts_one_active_per_device`) is what
    makes a device busy; assignment, the device views and the pending reasons all take the condition from here.
    """
    return (
        f"EXISTS (SELECT 1 FROM attempts r WHERE r.device_id = {devices}.device_id"
        f" AND r.status = '{AttemptStatus.ACTIVE.value}')"
    )


#: A device its host still lists, or that still runs an attempt: it is listed under that host.
HELD = f"(d.registered OR {device_busy('d')})"


def effective_labels(host: str = "host_labels", operator: str = "operator_labels") -> str:
    """SQL: the labels selectors match, the host's overlaid by the operator's (an operator's key wins).

    `devices.labels` holds them (`ck_devices_operator_labels_win`), written with this expression wherever
    either part changes, so that every query that matches labels reads one column.
    """
    return f"({host} || {operator})"


_UPSERT_HOST = text(
    """
    INSERT INTO hosts (host_id, agent_version, heartbeat_interval_s, registered_at, last_seen_at, actions)
    VALUES (:host_id, :version, :interval, :now, :now, CAST(:actions AS jsonb))
    ON CONFLICT (host_id) DO UPDATE
    SET agent_version = EXCLUDED.agent_version, heartbeat_interval_s = EXCLUDED.heartbeat_interval_s,
        registered_at = EXCLUDED.registered_at, last_seen_at = EXCLUDED.last_seen_at, actions = EXCLUDED.actions
    """
)

#: Devices named in the registration that belong to another host: registered there first, and not freed
#: by an operator since (listed or not, idle or not).
_TAKEN = text(
    """
    SELECT d.device_id, d.host_id FROM devices d
    WHERE d.device_id = ANY(CAST(:ids AS text[])) AND d.host_id <> :host_id AND d.freed_at IS NULL
    ORDER BY d.device_id
    FOR UPDATE OF d
    """
)

#: A freed device becomes the registering host's; another host's is refused by `tg_devices_owner_kept` too
#: (a registration racing the owner's first one loses there, runs again, and meets `_TAKEN`).
_UPSERT_DEVICES = text(
    f"""
    INSERT INTO devices (device_id, host_id, host_labels, labels, registered, updated_at)
    SELECT id, :host_id, CAST(l AS jsonb), CAST(l AS jsonb), true, :now
    FROM unnest(CAST(:ids AS text[]), CAST(:labels AS text[])) AS u(id, l)
    ON CONFLICT (device_id) DO UPDATE
    SET host_id = EXCLUDED.host_id, freed_at = NULL, host_labels = EXCLUDED.host_labels,
        labels = {effective_labels("EXCLUDED.host_labels", "devices.operator_labels")},
        registered = true, updated_at = EXCLUDED.updated_at
    """
)

_DROP_OTHERS = text(
    """
    UPDATE devices SET registered = false, updated_at = :now
    WHERE host_id = :host_id AND registered AND NOT (device_id = ANY(CAST(:ids AS text[])))
    """
)


async def register_host(
    conn: AsyncConnection,
    now: datetime,
    host_id: str,
    devices: Sequence[DeviceSpec],
    agent_version: str | None,
    heartbeat_interval_s: float,
    actions: Sequence[ActionSpec] = (),
) -> None:
    """Register `host_id` with exactly `devices` and `actions`, replacing its previous lists.

    A dropped device keeps a running attempt until it ends or expires, and gets no new work; it stays the
    host's. A drained device stays drained. A device id that belongs to another host (until an operator
    frees it: `operator_devices.forget_device`) is a conflict, and nothing changes. Each device's host
    labels get the reserved labels of the host's plug-in actions (`devsched.core.actions`); operator
    labels stay and win (`effective_labels`).

    Raises:
        DeviceConflict: a device id belongs to another host.
    """
    ids = [d.device_id for d in devices]
    taken = (await conn.execute(_TAKEN, {"ids": ids, "host_id": host_id})).all()
    if taken:
        raise DeviceConflict(
            f"device {taken[0].device_id} belongs to host {taken[0].host_id} until an operator frees it",
            devices={r.device_id: r.host_id for r in taken},
        )
    offered = [{"name": a.name, "version": a.version, "args_schema": a.args_schema} for a in actions]
    await conn.execute(
        _UPSERT_HOST,
        {
            "host_id": host_id,
            "version": agent_version,
            "interval": heartbeat_interval_s,
            "now": now,
            "actions": json.dumps(offered),
        },
    )
    if ids:
        derived = action_labels(a.name for a in actions)
        await conn.execute(
            _UPSERT_DEVICES,
            {
                "host_id": host_id,
                "ids": ids,
                "labels": [json.dumps({**d.labels, **derived}) for d in devices],
                "now": now,
            },
        )
    await conn.execute(_DROP_OTHERS, {"host_id": host_id, "ids": ids, "now": now})


_DEVICE_COLUMNS = f"""
    d.device_id, d.host_id, d.labels, d.operator_labels, d.drained, d.drain_reason,
    d.quarantined_at, d.quarantine_reason, d.infra_failures,
    {host_online("h")} AS online,
    {device_busy("d")} AS busy
"""


def device_state(*, drained: bool, busy: bool, online: bool, quarantined: bool = False) -> DeviceState:
    """What an operator sees of a device (the views and the metrics' device counts).

    Drained first (the operator's act), then quarantined (the scheduler's, also while a health check runs).
    """
    if drained:
        return DeviceState.DRAINED
    if quarantined:
        return DeviceState.QUARANTINED
    if busy:
        return DeviceState.RESERVED
    if not online:
        return DeviceState.OFFLINE
    return DeviceState.AVAILABLE


def device_view(row: Any) -> DeviceView:
    """The view of a row of `_DEVICE_COLUMNS`."""
    quarantined = row.quarantined_at is not None
    state = device_state(drained=row.drained, busy=row.busy, online=row.online, quarantined=quarantined)
    return DeviceView(
        row.device_id, row.host_id, visible_labels(row.labels), state, row.drained, row.drain_reason,
        quarantined=quarantined, quarantine_reason=row.quarantine_reason, quarantined_since=row.quarantined_at,
        infra_failures=row.infra_failures, operator_labels=dict(row.operator_labels),
    )  # fmt: skip


def _host_view(row: Any, devices: tuple[DeviceView, ...]) -> HostView:
    actions = tuple(ActionInfo(a["name"], a.get("version")) for a in row.actions)
    return HostView(row.host_id, bool(row.online), row.last_seen_at, row.agent_version, devices, actions)


_HOSTS = text(
    f"""
    SELECT host_id, agent_version, last_seen_at, actions,
           {host_online("hosts")} AS online
    FROM hosts ORDER BY host_id
    """
)
_LISTED_DEVICES = text(
    f"""
    SELECT {_DEVICE_COLUMNS}
    FROM devices d JOIN hosts h ON h.host_id = d.host_id
    WHERE {HELD}
    ORDER BY d.device_id
    """
)


async def list_hosts(conn: AsyncConnection, now: datetime) -> tuple[HostView, ...]:
    """Every host with its devices (a dropped device is listed while it still runs an attempt)."""
    by_host: dict[str, list[DeviceView]] = {}
    for row in (await conn.execute(_LISTED_DEVICES, {"now": now})).all():
        by_host.setdefault(row.host_id, []).append(device_view(row))
    return tuple(
        _host_view(h, tuple(by_host.get(h.host_id, ()))) for h in (await conn.execute(_HOSTS, {"now": now})).all()
    )


#: The args schemas hosts advertise for the named actions (null: a host that checks nothing), newest first.
_ACTION_SCHEMAS = text(
    """
    SELECT a.offer->>'name' AS name, a.offer->'args_schema' AS args_schema
    FROM hosts h CROSS JOIN LATERAL jsonb_array_elements(h.actions) AS a(offer)
    WHERE a.offer->>'name' = ANY(CAST(:names AS text[]))
    ORDER BY h.registered_at DESC, h.host_id
    """
)


async def action_schemas(conn: AsyncConnection, names: Sequence[str]) -> dict[str, list[dict[str, Any] | None]]:
    """For each of `names` that some host offers: the distinct args schemas advertised, newest first.

    None among them stands for a host that advertised no schema. An action no host offers is absent.
    """
    found: dict[str, list[dict[str, Any] | None]] = {}
    for row in (await conn.execute(_ACTION_SCHEMAS, {"names": list(names)})).all():
        schema = row.args_schema if isinstance(row.args_schema, dict) else None
        schemas = found.setdefault(row.name, [])
        if schema not in schemas:
            schemas.append(schema)
    return found


#: Returning a device to service (`drained` false) also lifts its quarantine and resets its count.
_DRAIN = text(
    """
    UPDATE devices SET drained = :drained, drain_reason = CASE WHEN :drained THEN :reason END,
                       updated_at = :now,
                       infra_failures = CASE WHEN :drained THEN infra_failures ELSE 0 END,
                       quarantined_at = CASE WHEN :drained THEN quarantined_at END,
                       quarantine_reason = CASE WHEN :drained THEN quarantine_reason END
    WHERE device_id = :device_id
    """
)
ONE_DEVICE = text(f"SELECT {_DEVICE_COLUMNS} FROM devices d JOIN hosts h USING (host_id) WHERE device_id = :id")


async def drain_device(
    conn: AsyncConnection, now: datetime, outbox: Outbox, device_id: str, drained: bool, reason: str | None
) -> DeviceView:
    """Take a device out of service (its running attempt goes on to its end), or return it.

    Returning it also lifts a quarantine (`drain --undo`), with its count of infrastructure failures, and
    queues a `device_returned` event in `outbox`.

    Raises:
        NotFound: no such device.
    """
    if not drained:
        await quarantine.returning(conn, now, outbox, device_ids=[device_id])
    result = await conn.execute(_DRAIN, {"device_id": device_id, "drained": drained, "reason": reason, "now": now})
    if result.rowcount == 0:
        raise NotFound(f"no device {device_id}", device_id=device_id)
    return device_view((await conn.execute(ONE_DEVICE, {"id": device_id, "now": now})).one())


_DRAIN_HOST_DEVICES = text(
    """
    UPDATE devices SET drained = :drained, drain_reason = CASE WHEN :drained THEN :reason END,
                       updated_at = :now,
                       infra_failures = CASE WHEN :drained THEN infra_failures ELSE 0 END,
                       quarantined_at = CASE WHEN :drained THEN quarantined_at END,
                       quarantine_reason = CASE WHEN :drained THEN quarantine_reason END
    WHERE host_id = :host_id AND registered
    """
)
_ONE_HOST = text(
    f"SELECT host_id, agent_version, last_seen_at, actions, {host_online('hosts')} AS online"
    " FROM hosts WHERE host_id = :id"
)
_HOST_DEVICES = text(
    f"""
    SELECT {_DEVICE_COLUMNS}
    FROM devices d JOIN hosts h ON h.host_id = d.host_id
    WHERE d.host_id = :id AND {HELD}
    ORDER BY d.device_id
    """
)


async def drain_host(
    conn: AsyncConnection, now: datetime, outbox: Outbox, host_id: str, drained: bool, reason: str | None
) -> HostView:
    """Drain (or return to service) every device the host lists now; running attempts go on to their end.

    Like a device's drain, it survives the host's re-registration: a host drained for maintenance takes no
    work after its agent restarts until it is returned to service. Returning it lifts its devices'
    quarantines as `drain_device` does (a `device_returned` event for each).

    Raises:
        NotFound: no such host.
    """
    host = (await conn.execute(_ONE_HOST, {"id": host_id, "now": now})).one_or_none()
    if host is None:
        raise NotFound(f"no host {host_id}", host_id=host_id)
    if not drained:
        await quarantine.returning(conn, now, outbox, host_id=host_id)
    await conn.execute(_DRAIN_HOST_DEVICES, {"host_id": host_id, "drained": drained, "reason": reason, "now": now})
    devices = tuple(device_view(r) for r in (await conn.execute(_HOST_DEVICES, {"id": host_id, "now": now})).all())
    return _host_view(host, devices)
