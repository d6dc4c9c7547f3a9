"""Device health: which attempt outcomes are the device's fault, and when a device is quarantined.

The scheduler counts each device's consecutive infrastructure failures; at `threshold` of them (the
settings' `quarantine_after`, 0: never) the device is quarantined: it takes no work until a health check
passes on it or an operator returns it (`drain --undo`). A success resets the count; a failure of the
code under test (`step_failed`), a timeout, a cancellation or an ordinary release (agent shutdown) leave
it as it is. This module is the ONE definition of "an infrastructure failure"; the store applies it in
the transaction that ends the attempt. Pure: no clock, no database.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from devsched.core.limits import PRIORITY_MAX
from devsched.core.retrying import RetryCause

#: Consecutive infrastructure failures that quarantine a device, by default.
QUARANTINE_AFTER_DEFAULT = 3
#: A release whose reason starts with this code (before any ": " or "; ") is the device's fault (a device
#: that vanished, a flashing that bricked it), not an agent shutdown.
DEVICE_FAULT = "device_fault"
#: The retry causes that are the device's (or the lab's) fault, not the code's.
INFRA_CAUSES: frozenset[RetryCause] = frozenset({RetryCause.INFRA, RetryCause.LEASE_EXPIRED})
#: The quarantine reason of a device whose health check failed.
HEALTH_CHECK_FAILED = "health_check_failed"
#: How often a device's health check runs again after it passed, by default (a day).
HEALTH_INTERVAL_DEFAULT_S = 86_400.0
#: A health task's priority: the highest, so its device takes it before any user task waiting for it.
HEALTH_PRIORITY = PRIORITY_MAX
#: A health task's lease ttl and attempts: one attempt (a failure is the answer, not something to retry).
HEALTH_LEASE_TTL_S = 60
HEALTH_MAX_ATTEMPTS = 1


def health_task_name(check: str) -> str:
    """The name a health task of the check `check` carries (what `devsched ls` shows)."""
    return f"health:{check}"


class DeviceOutcome(StrEnum):
    """What an ended attempt says about its device."""

    #: The attempt succeeded (or a health check passed): the device works.
    HEALTHY = "healthy"
    #: An infrastructure failure: counted.
    INFRA_FAILURE = "infra_failure"
    #: Nothing about the device (the test failed, a timeout, a cancellation, an agent shutdown).
    NEUTRAL = "neutral"


def is_device_fault(release_reason: str | None) -> bool:
    """Whether a release's reason names a device fault (`device_fault`, optionally followed by details)."""
    head = (release_reason or "").split(";", 1)[0].split(":", 1)[0].strip()
    return head == DEVICE_FAULT


def outcome_of(cause: RetryCause | None, *, done: bool = False) -> DeviceOutcome:
    """The device outcome of an attempt that ended done (`done`) or for `cause` (None: nothing to blame)."""
    if done:
        return DeviceOutcome.HEALTHY
    return DeviceOutcome.INFRA_FAILURE if cause in INFRA_CAUSES else DeviceOutcome.NEUTRAL


@dataclass(frozen=True, slots=True)
class Tally:
    """A device's count after an outcome, and whether this outcome quarantines it (only the crossing does)."""

    infra_failures: int
    quarantine: bool


def tally(infra_failures: int, outcome: DeviceOutcome, threshold: int, *, quarantined: bool = False) -> Tally:
    """The device's consecutive infrastructure failures after `outcome`, and whether it becomes quarantined.

    `threshold` 0 never quarantines. A device already quarantined is not quarantined again (its reason and
    `since` stay the first ones); a healthy outcome resets the count but does not return it: that takes a
    passing health check or an operator (`returns`).

    Raises:
        ValueError: a negative count or threshold.
    """
    if infra_failures < 0 or threshold < 0:
        raise ValueError(f"need non-negative count and threshold, got {infra_failures}, {threshold}")
    if outcome is DeviceOutcome.HEALTHY:
        return Tally(0, False)
    if outcome is DeviceOutcome.NEUTRAL:
        return Tally(infra_failures, False)
    count = infra_failures + 1
    return Tally(count, threshold > 0 and count >= threshold and not quarantined)


def quarantine_reason(count: int, last: str) -> str:
    """The reason shown for a device quarantined by `count` consecutive failures, the last one `last`."""
    return f"{count} consecutive infrastructure failures (last: {last})"
