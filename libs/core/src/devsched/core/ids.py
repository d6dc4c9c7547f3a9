"""Identifiers: task and lease ids are UUIDs made by the scheduler; host, device and prefix are tokens."""

from __future__ import annotations

import re
import uuid

#: A single NATS subject token: 1 to 64 of A-Z a-z 0-9 _ -.
TOKEN_PATTERN = r"^[A-Za-z0-9_-]{1,64}$"
_TOKEN = re.compile(TOKEN_PATTERN)


def is_token(value: str) -> bool:
    """Whether `value` may be used as a prefix, host id or device id."""
    return bool(_TOKEN.fullmatch(value))


def new_task_id() -> uuid.UUID:
    """A fresh task id."""
    return uuid.uuid4()


def new_lease_id() -> uuid.UUID:
    """A fresh lease id: a fencing token that external systems can compare."""
    return uuid.uuid4()
