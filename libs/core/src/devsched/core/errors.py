"""The error hierarchy: one root, a stable protocol code and HTTP-like number per class.

Raised by the domain rules, the store and the services alike; the transport maps `code` and
`status` onto the NATS service error headers in one place.
"""

from __future__ import annotations

from typing import Any, ClassVar


class DevschedError(Exception):
    """Something went wrong in devsched."""

    #: Machine code from the protocol's error table.
    code: ClassVar[str] = "internal"
    #: HTTP-like number carried in `Nats-Service-Error-Code`.
    status: ClassVar[int] = 500
    #: Whether repeating the same request may succeed.
    retryable: ClassVar[bool] = False

    def __init__(self, message: str | None = None, **details: Any) -> None:
        self.message = message or (self.__doc__ or self.code).strip().splitlines()[0]
        self.details: dict[str, Any] = details
        super().__init__(self.message)


class InvalidRequest(DevschedError):
    """The request is malformed or out of range."""

    code = "invalid_request"
    status = 400


class NotFound(DevschedError):
    """No such task, host or device."""

    code = "not_found"
    status = 404


class Conflict(DevschedError):
    """The request conflicts with the current state; nothing changed."""

    code = "conflict"
    status = 409


class LeaseExpired(Conflict):
    """The lease has expired."""

    code = "lease_expired"


class LeaseSuperseded(Conflict):
    """The attempt or lease is not the task's current one."""

    code = "lease_superseded"


class LeaseForeign(Conflict):
    """The lease belongs to another host."""

    code = "lease_foreign"


class TaskTerminal(Conflict):
    """The task has already ended."""

    code = "task_terminal"


class OutcomeConflict(Conflict):
    """The attempt already recorded a different outcome."""

    code = "outcome_conflict"


class CancelNotRequested(Conflict):
    """No cancellation was requested for this task."""

    code = "cancel_not_requested"


class DeviceConflict(Conflict):
    """The device id is registered by another host."""

    code = "device_conflict"


class TooLarge(DevschedError):
    """The payload is larger than the configured limit."""

    code = "too_large"
    status = 413


class ArtifactTooLarge(TooLarge):
    """The artifact is larger than the per-file cap (an addition, issue 12)."""

    code = "artifact_too_large"


class ArtifactQuotaExceeded(TooLarge):
    """The attempt's artifacts would exceed the per-attempt cap (an addition, issue 12)."""

    code = "artifact_quota_exceeded"


class UploadMismatch(InvalidRequest):
    """The uploaded chunks are not the file the commit describes: missing, or another size or SHA-256."""

    code = "upload_mismatch"


class UploadTimeout(DevschedError):
    """The artifact commit did not complete within its deadline; the chunks read so far are purged (an addition).

    The host may upload the file again and commit it anew.
    """

    code = "upload_timeout"
    status = 408


class TooManyRequests(DevschedError):
    """Too many requests from this host; retry after `details.retry_after_s` seconds.

    The scheduler's fair share per host: one host cannot take the capacity every other host needs to
    renew its leases in time. Nothing changed; the same request may be sent again after the pause.
    """

    code = "too_many_requests"
    status = 429
    retryable = True


class StorageFull(DevschedError):
    """The JetStream store has no room for one host more (an addition): registration refused.

    Each host has its own logs and uploads streams, each a fixed share of the budgets (`max_hosts` hosts at
    most), so that no host can take the room of another; the room is there again once an operator raises
    the budget or removes a host's streams. Nothing changed (its devices are not registered); the
    registration may be repeated (the agent does, with its backoff), but only room made by an operator helps.
    """

    code = "storage_full"
    status = 507


class Unavailable(DevschedError):
    """The database is unreachable; the request may be retried.

    Nothing changed, unless `details.outcome` is `unknown`: the connection was lost while the change was
    committing, so it may have been applied. A repeat (a submit with the same idempotency key, a report or
    release, which are idempotent) finds out.
    """

    code = "unavailable"
    status = 503
    retryable = True


class Internal(DevschedError):
    """Internal error; nothing changed."""

    code = "internal"
    status = 500


class ReplyTooLarge(Internal):
    """The reply does not fit the NATS server's `max_payload`; nothing changed (an addition).

    `details` name the endpoint, the reply's size and the limit: ask for a smaller page or view.
    """

    code = "reply_too_large"


class IllegalTransition(DevschedError):
    """A state change that the lifecycle table does not allow (a bug, never user input)."""

    code = "internal"
    status = 500


#: Every concrete error class by its protocol code, for decoding error replies.
BY_CODE: dict[str, type[DevschedError]] = {
    cls.code: cls
    for cls in (
        InvalidRequest,
        NotFound,
        LeaseExpired,
        LeaseSuperseded,
        LeaseForeign,
        TaskTerminal,
        OutcomeConflict,
        CancelNotRequested,
        DeviceConflict,
        TooLarge,
        ArtifactTooLarge,
        ArtifactQuotaExceeded,
        UploadMismatch,
        UploadTimeout,
        TooManyRequests,
        StorageFull,
        Unavailable,
        Internal,
        ReplyTooLarge,
    )
}
