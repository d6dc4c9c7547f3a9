"""The errors a client call can raise: the protocol's typed errors, plus two of the client's own.

Every error is a `DevschedError` with a stable `code` (the protocol's machine code), an HTTP-like
`status`, a `message` and `details`. A 400 `InvalidRequest` carries `details["errors"]`, a list of
`{"path": "plan.steps.0.action", "message": "..."}`; `field_errors()` reads it. Errors raised before
anything is sent (a plan file that does not parse, a task id that is not a UUID) are the same
`InvalidRequest`, with the same paths the server would give.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from devsched.core.errors import (
    CancelNotRequested,
    Conflict,
    DeviceConflict,
    DevschedError,
    Internal,
    InvalidRequest,
    LeaseExpired,
    LeaseForeign,
    LeaseSuperseded,
    NotFound,
    OutcomeConflict,
    TaskTerminal,
    TooLarge,
    Unavailable,
)
from devsched.protocol.codec import schema_errors
from devsched.protocol.transport import NoReply


class NatsUnreachable(DevschedError):
    """Cannot reach the NATS server.

    Client side only, never on the wire: the connection could not be made within the timeout, or it
    was lost and not restored.
    """

    code = "nats_unreachable"
    status = 503
    retryable = True


class PlanFileError(InvalidRequest):
    """A plan file cannot be read or parsed (the file itself, before any schema check)."""


def field_errors(err: DevschedError) -> list[tuple[str, str]]:
    """The `(path, message)` pairs of a 400 error; empty for other errors.

    The path is dotted (`plan.steps.0.args`); `""` means the whole body.
    """
    errors = err.details.get("errors")
    if not isinstance(errors, list):
        return []
    out: list[tuple[str, str]] = []
    for item in errors:
        if isinstance(item, dict):
            out.append((str(item.get("path", "")), str(item.get("message", ""))))
    return out


def describe(err: DevschedError) -> str:
    """One line for people: `code: path: message; path: message` (paths only for 400s)."""
    pairs = field_errors(err)
    if pairs:
        text = "; ".join(f"{path}: {message}" if path else message for path, message in pairs)
        total = err.details.get("error_count")
        if isinstance(total, int) and total > len(pairs):
            text += f" (and {total - len(pairs)} more)"
    else:
        text = err.message
    return f"{err.code}: {' '.join(text.split())}"


def invalid(path: str, message: str) -> InvalidRequest:
    """An `InvalidRequest` for one field, shaped like the server's (`details.errors`)."""
    where = f"{path}: " if path else ""
    return InvalidRequest(f"invalid request: {where}{message}", errors=[{"path": path, "message": message}])


def from_validation(exc: ValidationError, *, prefix: str = "") -> InvalidRequest:
    """A pydantic error as the server would report it (`details.errors` with dotted paths)."""
    errors: list[dict[str, Any]] = [
        {"path": f"{prefix}.{e['path']}".strip(".") if prefix else e["path"], "message": e["message"]}
        for e in schema_errors(exc)
    ]
    first = errors[0]
    where = f"{first['path']}: " if first["path"] else ""
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return InvalidRequest(f"invalid request: {where}{first['message']}{more}", errors=errors)


__all__ = [
    "CancelNotRequested",
    "Conflict",
    "DeviceConflict",
    "DevschedError",
    "Internal",
    "InvalidRequest",
    "LeaseExpired",
    "LeaseForeign",
    "LeaseSuperseded",
    "NatsUnreachable",
    "NoReply",
    "NotFound",
    "OutcomeConflict",
    "PlanFileError",
    "TaskTerminal",
    "TooLarge",
    "Unavailable",
    "describe",
    "field_errors",
    "from_validation",
    "invalid",
]
