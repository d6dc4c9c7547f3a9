"""Why a queued task waits: one rule over a count of its matching devices, shared by `get` and `list`.

The store counts, in one query for a whole page of tasks (one row per distinct selector), what stands
between each selector and a device; this module turns a task and its count into the `pending_reason` of
the task view: a stable code, a colon, and an explanation. Keeping the rule here, pure, means a task
listing and a task view cannot disagree, and every branch is tested without a database.

The codes, most telling first: `retry_backoff`, `no_matching_device`, `no_host_with_action`,
`no_online_device`, `devices_drained`, `devices_quarantined`, `devices_busy`, `device_grace`,
`awaiting_assignment`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum


class PendingCode(StrEnum):
    """The stable code that starts a `pending_reason`."""

    #: The retry policy waits until the task's `not_before`.
    RETRY_BACKOFF = "retry_backoff"
    #: No registered device matches the selector.
    NO_MATCHING_DEVICE = "no_matching_device"
    #: Devices match the selector but none of a host that offers the plug-in actions the plan uses.
    NO_HOST_WITH_ACTION = "no_host_with_action"
    #: Every matching device is on a host that missed its heartbeats.
    NO_ONLINE_DEVICE = "no_online_device"
    #: Every online match is drained by an operator.
    DEVICES_DRAINED = "devices_drained"
    #: Every online match is out of service and at least one is quarantined (the others drained).
    DEVICES_QUARANTINED = "devices_quarantined"
    #: Every online, in-service match runs another task.
    DEVICES_BUSY = "devices_busy"
    #: Every free match is in its post-expiry grace.
    DEVICE_GRACE = "device_grace"
    #: A match is free: the next assignment pass takes it.
    AWAITING_ASSIGNMENT = "awaiting_assignment"


@dataclass(frozen=True, slots=True)
class Waiting:
    """What of a queued task its pending reason depends on, besides its devices."""

    attempt_count: int
    #: When its retry backoff ends; None when it is not backing off.
    not_before: datetime | None = None
    #: The plug-in actions its plan uses (each a reserved label of its selector).
    actions: Sequence[str] = ()


@dataclass(frozen=True, slots=True)
class Matches:
    """The registered devices that match a selector, counted by what keeps them from taking it.

    Each count is a subset of the one before it, as the rule reads them: `matching` devices (the whole
    selector, action labels included), of which `online` ones (on an online host), of which `drained`
    and `quarantined` (not drained) are out of service; of the rest `busy` run an attempt, and of the idle
    ones `ready` are out of their grace. `grace_until` is the earliest end of an idle in-service match's
    grace. `without_actions` counts the devices that match the selector without its action labels.
    """

    matching: int = 0
    online: int = 0
    drained: int = 0
    quarantined: int = 0
    busy: int = 0
    ready: int = 0
    grace_until: datetime | None = None
    without_actions: int = 0

    @property
    def in_service(self) -> int:
        """Online matches neither drained nor quarantined."""
        return self.online - self.drained - self.quarantined


def pending_reason(task: Waiting, devices: Matches, now: datetime) -> str:
    """Why `task` still waits at `now`, given its matching `devices`: `<code>: <explanation>`."""
    if task.not_before is not None and task.not_before > now:
        return (
            f"{PendingCode.RETRY_BACKOFF}: attempt {task.attempt_count} ended and the retry policy waits until "
            f"{task.not_before.isoformat()}"
        )
    if devices.online == 0:
        if devices.matching:
            return f"{PendingCode.NO_ONLINE_DEVICE}: every device matching the selector is on an offline host"
        if task.actions and devices.without_actions:
            offered = ", ".join(task.actions)
            return f"{PendingCode.NO_HOST_WITH_ACTION}: no host with a matching device offers {offered}"
        return f"{PendingCode.NO_MATCHING_DEVICE}: no registered device matches the selector"
    if devices.in_service == 0:
        if devices.quarantined == 0:
            return f"{PendingCode.DEVICES_DRAINED}: every online device matching the selector is drained"
        drained = f", {devices.drained} drained" if devices.drained else ""
        return (
            f"{PendingCode.DEVICES_QUARANTINED}: every online device matching the selector is out of service "
            f"({devices.quarantined} quarantined after repeated infrastructure failures{drained})"
        )
    if devices.busy == devices.in_service:
        return f"{PendingCode.DEVICES_BUSY}: all {devices.in_service} matching devices are running other tasks"
    if devices.ready == 0 and devices.grace_until is not None:
        until = devices.grace_until.isoformat()
        return f"{PendingCode.DEVICE_GRACE}: matching devices are in their post-expiry grace until {until}"
    return f"{PendingCode.AWAITING_ASSIGNMENT}: a matching device is free; the scheduler assigns it shortly"
