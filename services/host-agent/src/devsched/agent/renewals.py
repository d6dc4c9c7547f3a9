"""The host's renewal batcher: its keepers' renewals go out together in `renewals` requests.

Group commit, never a timer: a renewal asked for when no request is in flight goes out at the end of the
loop turn (with the others asked for in that turn); those asked for while one is in flight go out together
as soon as it is answered, split at `MAX_RENEWALS_PER_REQUEST`. Each caller gets its own lease's answer:
the grant, or the error `renew` would have raised for that lease (so the keeper's `ends_lease` works as for
`renew`). A failure of the whole request (timeout, 5xx) is raised to each caller as a transient error.

Alignment: when a batch is about to go out, every member keeper whose periodic renewal falls due within
half its interval is asked to renew now and rides along; its schedule moves with the grant. Keepers that
came up at different times thus converge on one request per renewal interval for the whole host.

Only for a scheduler that said `renewals` in its register or heartbeat reply. When nothing serves the
subject (an older scheduler during a rolling upgrade) or the request as a whole is refused (404, 400), the
batch goes out one `renew` per lease and the flag is cleared until a reply says `renewals` again.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Sequence
from typing import Protocol

from devsched.core.errors import Conflict, DevschedError, Internal, InvalidRequest, NotFound, Unavailable
from devsched.core.leases import Extension
from devsched.core.limits import MAX_RENEWALS_PER_REQUEST
from devsched.protocol.messages import Progress, RenewRequest
from devsched.protocol.transport import NoReply

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
    if isinstance(exc, NoReply):
        return exc.details.get("reason") == "no_responders"
    return isinstance(exc, NotFound | InvalidRequest)


def transient(exc: BaseException) -> DevschedError:
    """The error each caller gets for a request that failed as a whole: never one that ends a lease."""
    if isinstance(exc, DevschedError) and not isinstance(exc, Conflict | NotFound):
        err = type(exc)(exc.message)
        err.details = dict(exc.details)
        return err
    return Unavailable(f"renewals request failed: {type(exc).__name__}")


_Waiting = tuple[RenewRequest, "asyncio.Future[Extension]"]


class RenewalBatcher:
    """Sends one host's lease renewals together; see the module docstring."""

    def __init__(
        self,
        client: RenewingClient,
        *,
        timeout_s: float,
        max_batch: int = MAX_RENEWALS_PER_REQUEST,
    ) -> None:
        if not 1 <= max_batch <= MAX_RENEWALS_PER_REQUEST:
            raise ValueError(f"max_batch must be in [1, {MAX_RENEWALS_PER_REQUEST}], got {max_batch}")
        self._client = client
        self._timeout_s = timeout_s
        self._max_batch = max_batch
        self._waiting: list[_Waiting] = []
        self._members: set[Member] = set()
        self._flusher: asyncio.Task[None] | None = None

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
        if not self._client.renewals:
            return await self._one(lease)
        future: asyncio.Future[Extension] = asyncio.get_running_loop().create_future()
        self._waiting.append((lease, future))
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush(), name="renewals")
        return await future

    async def _one(self, lease: RenewRequest) -> Extension:
        return await self._client.renew(
            lease.task_id, lease.attempt, lease.lease_id, lease.progress, timeout_s=self._timeout_s
        )

    async def _flush(self) -> None:
        """Send batches while renewals wait; each batch gathers what the loop turn and the joiners add."""
        await asyncio.sleep(0)  # the renewals asked for in this loop turn go in the same request
        while self._waiting:
            await self._gather_joiners()
            batch = self._take()
            if not batch:
                continue
            chunks = [batch[i : i + self._max_batch] for i in range(0, len(batch), self._max_batch)]
            await asyncio.gather(*(self._send(chunk) for chunk in chunks))

    async def _gather_joiners(self) -> None:
        if not self._client.renewals:
            return  # lease by lease now: riding along would only renew early
        expected = len(self._waiting) + sum(1 for member in list(self._members) if member.join())
        for _ in range(JOIN_TURNS):
            if len(self._waiting) >= expected:
                return
            await asyncio.sleep(0)

    def _take(self) -> list[_Waiting]:
        """The waiting renewals still wanted, each lease once (a repeat waits for the next batch)."""
        batch: list[_Waiting] = []
        later: list[_Waiting] = []
        seen: set[tuple[uuid.UUID, int]] = set()
        for lease, future in self._waiting:
            if future.done():  # its caller gave up (timeout, cancellation)
                continue
            key = (lease.task_id, lease.attempt)
            (later if key in seen else batch).append((lease, future))
            seen.add(key)
        self._waiting = later
        return batch

    async def _send(self, chunk: list[_Waiting]) -> None:
        if not self._client.renewals:
            await self._one_by_one(chunk)
            return
        try:
            answers = await self._client.renew_several([lease for lease, _ in chunk], timeout_s=self._timeout_s)
        except Exception as exc:
            if unserved(exc):
                if self._client.renewals:
                    self._client.renewals = False  # until a register or heartbeat reply says so again
                    logger.warning("renewals not served, renewing lease by lease", extra={"error": repr(exc)})
                await self._one_by_one(chunk)
                return
            for _, future in chunk:
                if not future.done():
                    future.set_exception(transient(exc))
            return
        if len(answers) != len(chunk):
            answers = [Internal("a renewals reply with another number of answers") for _ in chunk]
        for (_, future), answer in zip(chunk, answers, strict=True):
            if future.done():
                continue
            if isinstance(answer, DevschedError):
                future.set_exception(answer)
            else:
                future.set_result(answer)

    async def _one_by_one(self, chunk: list[_Waiting]) -> None:
        async def one(lease: RenewRequest, future: asyncio.Future[Extension]) -> None:
            try:
                grant = await self._one(lease)
            except Exception as exc:
                if not future.done():
                    future.set_exception(exc)
                return
            if not future.done():
                future.set_result(grant)

        await asyncio.gather(*(one(lease, future) for lease, future in chunk))
