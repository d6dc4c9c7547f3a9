"""Statuses of tasks and attempts, and the reasons a task or attempt ends."""

from enum import StrEnum


class TaskStatus(StrEnum):
    """Where a task is in its lifecycle."""

    #: Waiting for a free matching device.
    QUEUED = "queued"
    #: A device is reserved and an attempt with a lease exists; the host has not claimed it yet.
    ASSIGNED = "assigned"
    #: The owning host claimed the attempt and is running it.
    DISPATCHED = "dispatched"
    #: The host reported success.
    DONE = "done"
    #: The host reported failure, or the lease expired at the attempt limit.
    FAILED = "failed"
    #: Cancelled while queued, reported cancelled, or expired with a cancellation pending.
    CANCELLED = "cancelled"


IN_FLIGHT: frozenset[TaskStatus] = frozenset({TaskStatus.ASSIGNED, TaskStatus.DISPATCHED})
TERMINAL: frozenset[TaskStatus] = frozenset({TaskStatus.DONE, TaskStatus.FAILED, TaskStatus.CANCELLED})


class AttemptStatus(StrEnum):
    """Where one attempt (one lease on one device) is."""

    #: The lease is live: the attempt may be claimed, renewed and reported.
    ACTIVE = "active"
    #: The lease ran out before a report; kept for audit.
    EXPIRED = "expired"
    #: Reported done.
    DONE = "done"
    #: Reported failed.
    FAILED = "failed"
    #: Reported cancelled.
    CANCELLED = "cancelled"
    #: Given back by its host (agent shutdown, drain, restart): nothing runs on the device any more.
    RELEASED = "released"


#: Attempt statuses of an attempt that ended by its host's word (a report or a release).
RECORDED: frozenset[AttemptStatus] = frozenset(
    {AttemptStatus.DONE, AttemptStatus.FAILED, AttemptStatus.CANCELLED, AttemptStatus.RELEASED}
)


class Outcome(StrEnum):
    """What a host may report at the end of an attempt."""

    #: Every step succeeded.
    DONE = "done"
    #: A step failed or timed out, or the run stopped for a reason other than cancellation.
    FAILED = "failed"
    #: The run stopped because the host saw a cancellation request.
    CANCELLED = "cancelled"

    @property
    def task_status(self) -> TaskStatus:
        """The task status this outcome ends the task in."""
        return TaskStatus(self.value)

    @property
    def attempt_status(self) -> AttemptStatus:
        """The attempt status this outcome ends the attempt in."""
        return AttemptStatus(self.value)


class EndReason(StrEnum):
    """Why an attempt ended (`attempts.end_reason`)."""

    #: Reported done by the host.
    DONE = "done"
    #: Reported failed by the host.
    FAILED = "failed"
    #: Reported cancelled by the host.
    CANCELLED = "cancelled"
    #: Its lease expired before a report.
    LEASE_EXPIRED = "lease_expired"
    #: Given back by its host before it ended (`P.host.<host_id>.release`).
    RELEASED = "released"
    #: Ended by the sweeper: it ran past the task's `attempt_timeout_s` (and a lease ttl more for its host to stop).
    ATTEMPT_TIMEOUT = "attempt_timeout"
    #: Ended by the sweeper: it ran past the task's `deadline` (and a lease ttl more for its host to stop).
    DEADLINE_EXCEEDED = "deadline_exceeded"


class TaskReason(StrEnum):
    """Reasons of the control plane's own for ending a task (`tasks.reason`)."""

    #: Failed: the lease expired and no attempts were left.
    LEASE_EXPIRED = "lease_expired"
    #: Cancelled before any device was assigned.
    CANCELLED_WHILE_QUEUED = "cancelled_while_queued"
    #: Cancelled: the lease expired while a cancellation was pending.
    CANCELLED_AFTER_LEASE_EXPIRED = "cancelled_after_lease_expired"
    #: Cancelled: the host released the attempt while a cancellation was pending.
    CANCELLED_AFTER_RELEASE = "cancelled_after_release"
    #: Failed: the host released the attempt, and the task had been released the most times allowed.
    RELEASED_TOO_OFTEN = "released_too_often"
    #: Failed: the host released the attempt, and the task's retry policy does not retry releases.
    RELEASED = "released"
    #: Failed: no device took the task within its `queue_timeout_s`.
    QUEUE_TIMEOUT = "queue_timeout"
    #: Failed: the attempt ran past the task's `attempt_timeout_s` (stopped by its host, or by the sweeper).
    ATTEMPT_TIMEOUT = "attempt_timeout"
    #: Failed: the task's `deadline` passed before it ended.
    DEADLINE_EXCEEDED = "deadline_exceeded"


class DeviceState(StrEnum):
    """What an operator sees of a device."""

    #: Online, in service, and free (or about to be, after its post-expiry grace).
    AVAILABLE = "available"
    #: Running an attempt.
    RESERVED = "reserved"
    #: Its host missed three heartbeats.
    OFFLINE = "offline"
    #: Taken out of service by an operator.
    DRAINED = "drained"
    #: Taken out of service by the scheduler after consecutive infrastructure failures (`core.health`).
    QUARANTINED = "quarantined"


class TaskKind(StrEnum):
    """Who a task is for: a user's, or a health check the scheduler submitted for one device (issue 13)."""

    USER = "user"
    HEALTH = "health"


class EventKind(StrEnum):
    """Kinds of task events published on `P.events.task.<task_id>`."""

    SUBMITTED = "submitted"
    ASSIGNED = "assigned"
    DISPATCHED = "dispatched"
    PROGRESS = "progress"
    CANCEL_REQUESTED = "cancel_requested"
    REQUEUED = "requeued"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"
