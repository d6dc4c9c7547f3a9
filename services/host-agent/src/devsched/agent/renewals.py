"""The host's renewal batcher: its keepers' renewals go out together in `renewals` requests.

Batches form by the group commit of `devsched.agent.batching`, split at `MAX_RENEWALS_PER_REQUEST`. A
caller gets its lease's grant or the error `renew` would have raised for it, so the keeper's `ends_lease`
works as for `renew`; a timeout or 5xx of the whole request comes as a transient error.

Alignment: when a batch is about to go out, every member keeper whose periodic renewal falls due within
half its interval is asked to renew now and rides along; its schedule moves with the grant. Keepers that
came up at different times thus converge on one request per renewal interval for the whole host.

Only for a scheduler that said `renewals` in its register or heartbeat reply. A request refused whole
(404, 400) counts as not served, as one nothing answers does: one `renew` per lease until a reply says
`renewals` again.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Hashable, Sequence
from typing import Protocol

from devsched.agent.batching import GroupCommit, not_served, whole_failure
from devsched.core.errors import Conflict, DevschedError, InvalidRequest, NotFound
from devsched.core.leases import Extension
from devsched.core.limits import MAX_RENEWALS_PER_REQUEST
from devsched.protocol.messages import Progress, RenewRequest

logger = logging.getLogger(__name__)

#: Loop turns a batch waits at most for the keepers it asked to join (each needs one to wake and ask).
JOIN_TURNS = 3


class RenewingClient(Protocol):
    """What the batcher needs of the host's client (`HostClient`)."""

    #: Whether the scheduler said it serves `renewals`; the batcher clears it when nothing does.
    renewals: bool

    async def renew(
        self, task_id: uuid.UUID, attempt: int, lease_id: uuid.UUID, progress: Progress | None, *, timeout_s: float
    ) -> Extension:
        """One lease's `renew`."""
        ...

    async def renew_several(
        self, leases: Sequence[RenewRequest], *, timeout_s: float
    ) -> list[Extension | DevschedError]:
        """One `renewals` request: each lease's grant or error, in order."""
        ...


class Member(Protocol):
    """A lease keeper that may ride along with a batch."""

    def join(self) -> bool:
        """Renew now if the periodic renewal is due soon; whether it will."""
        ...


def unserved(exc: BaseException) -> bool:
    """Whether a failed `renewals` request means the scheduler does not take it (renew one by one instead)."""
    return not_served(exc, (NotFound, InvalidRequest))


def transient(exc: BaseException) -> DevschedError:
    """The error each caller gets for a request that failed as a whole: never one that ends a lease."""
    return whole_failure(exc, "renewals", (Conflict, NotFound))


class RenewalBatcher(GroupCommit[RenewRequest, Extension]):
    """Sends one host's lease renewals together; see the module docstring."""

    _name = "renewals"
    _logger = logger
    _not_served = "renewals not served, renewing lease by lease"

    def __init__(
        self,
        client: RenewingClient,
        *,
        timeout_s: float,
        max_batch: int = MAX_RENEWALS_PER_REQUEST,
    ) -> None:
        super().__init__(max_batch=max_batch, limit=MAX_RENEWALS_PER_REQUEST)
        self._client = client
        self._timeout_s = timeout_s
        self._members: set[Member] = set()

    def enter(self, member: Member) -> None:
        """Count `member` among the keepers a batch asks to ride along."""
        self._members.add(member)

    def leave(self, member: Member) -> None:
        """Stop asking `member` (its run ended)."""
        self._members.discard(member)

    async def renew(self, lease: RenewRequest) -> Extension:
        """Renew `lease` with the next batch (or alone, by `renew`, when the scheduler does not take batches).

        Raises:
            DevschedError: the lease's own error (as `renew` raises it), or the batch's as a transient one.
        """
        return await self._submit(lease)

    async def _gather_joiners(self) -> None:
        if not self._client.renewals:
            return  # lease by lease now: riding along would only renew early
        expected = len(self._waiting) + sum(1 for member in list(self._members) if member.join())
        for _ in range(JOIN_TURNS):
            if len(self._waiting) >= expected:
                return
            await asyncio.sleep(0)

    def _served(self) -> bool:
        return self._client.renewals

    def _unserve(self) -> None:
        self._client.renewals = False

    def _key(self, item: RenewRequest) -> Hashable:
        return (item.task_id, item.attempt)

    async def _one(self, item: RenewRequest) -> Extension:
        return await self._client.renew(
            item.task_id, item.attempt, item.lease_id, item.progress, timeout_s=self._timeout_s
        )

    async def _request(self, items: list[RenewRequest]) -> Sequence[Extension | DevschedError]:
        return await self._client.renew_several(items, timeout_s=self._timeout_s)

    def _unserved(self, exc: Exception) -> bool:
        return unserved(exc)

    def _transient(self, exc: Exception) -> DevschedError:
        return transient(exc)
