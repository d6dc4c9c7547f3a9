"""How long ended tasks are kept, and which may be pruned: the rule the database's prune function applies.

A task is pruned with everything that belongs to it (attempts, reservations, cancellation requests, its
sent outbox rows) once it has ended and `keep` has passed since it last changed. A queued or running task
is never pruned, however old: its history is still being written. `keep` has a floor, so that a
misconfigured sweeper cannot empty the tables of what a user is still looking at.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from devsched.core.status import TERMINAL, TaskStatus

#: The default retention of ended tasks.
RETENTION_DEFAULT = timedelta(days=30)
#: The least retention the database accepts (its prune function refuses a shorter one).
RETENTION_MIN = timedelta(hours=1)
#: The most tasks one prune transaction removes.
PRUNE_BATCH_MAX = 10_000


def check_retention(keep: timedelta) -> timedelta:
    """`keep` if it is at least `RETENTION_MIN`; a clear error otherwise."""
    if keep < RETENTION_MIN:
        raise ValueError(f"retention {keep} is shorter than the least allowed, {RETENTION_MIN}")
    return keep


def prunable(status: TaskStatus, created_at: datetime, updated_at: datetime, now: datetime, keep: timedelta) -> bool:
    """Whether a task with these fields may be pruned at `now` with retention `keep`."""
    cutoff = now - check_retention(keep)
    return status in TERMINAL and created_at < cutoff and updated_at < cutoff
