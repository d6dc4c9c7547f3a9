"""Matching queued tasks to free devices."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from devsched.core.records import DeviceRecord, QueuedTask, Selector


def matches(selector: Selector, device: DeviceRecord) -> bool:
    """Whether `device` satisfies `selector`: its labels contain every pair, and the id if named."""
    if selector.device_id is not None and selector.device_id != device.device_id:
        return False
    return all(device.labels.get(k) == v for k, v in selector.labels.items())


def plan_assignments(
    tasks: Sequence[QueuedTask], devices: Iterable[DeviceRecord]
) -> list[tuple[QueuedTask, DeviceRecord]]:
    """Greedy assignment: each task in the given order (priority, then age) takes the first free match.

    Greedy in priority order never lets a lower-priority task take a device that a higher-priority one
    could use; devices are tried in the given order, so callers control spreading. A task retried after a
    failure takes the device it failed on (`avoid_device_id`) only when no other free device matches: it
    prefers another, and never waits for one.
    """
    free = list(devices)
    plan: list[tuple[QueuedTask, DeviceRecord]] = []
    for task in tasks:
        fallback: int | None = None
        for i, device in enumerate(free):
            if matches(task.selector, device):
                if device.device_id != task.avoid_device_id:
                    plan.append((task, free.pop(i)))
                    break
                fallback = i
        else:
            if fallback is not None:
                plan.append((task, free.pop(fallback)))
        if not free:
            break
    return plan
