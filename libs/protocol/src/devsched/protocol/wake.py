"""The body of `P.internal.wake` (`Subjects.internal_wake`), between the services of one deployment."""

from __future__ import annotations

from pydantic import Field

from devsched.protocol.base import ReplyModel


class Wake(ReplyModel):
    """Core NATS, fire and forget: the lease sweeper released leases; each scheduler runs its loops at once.

    A published message: decoding ignores fields it does not know, so a newer sweeper may say more.
    """

    released: int = Field(ge=0)
    """How many leases the sweep released (0: a wake-up for another reason, such as the bench's)."""
