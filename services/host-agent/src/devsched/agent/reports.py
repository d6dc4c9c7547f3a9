"""The host's report batcher: terminal reports ready together go to the scheduler in one `reports` request.

Group commit, never a timer: a report sent when no request is in flight goes out at the end of the loop
turn (with the others sent in that turn); those sent while one is in flight go out together as soon as it
is answered, split at `MAX_REPORTS_PER_REQUEST` and at the request payload limit. A report alone goes out
as a plain `report`. Each report's entry is its spooled bytes unchanged (every try of a report carries the
identical bytes), and each caller gets its own report's answer: the reply (a hand-over in it), or the
error `report` would have raised for it, so `Reporter.deliver` handles it exactly as a `report`'s answer
(spool removal, moot, rejected, parked, take_next). A failure of the whole request (no reply, 429, 5xx)
is raised to each caller as a transient error of the same kind, never one that ends or rejects a report.
A `reports` request continues the trace of its first report (a request carries one trace context); a
report sent alone continues its own, as its `report` would.

Only for a scheduler that said `reports` in its register or heartbeat reply. When nothing serves the
subject (an older scheduler during a rolling upgrade) or it is not found, the reports go out one `report`
each and the flag is cleared until a reply says `reports` again; a request refused whole as invalid or
too large goes out one `report` each too, so each report meets its own answer. Releases are not batched:
each goes to `release` as before.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from devsched.core.errors import Conflict, DevschedError, Internal, InvalidRequest, NotFound, TooLarge, Unavailable
from devsched.core.limits import MAX_REPORTS_PER_REQUEST
from devsched.protocol.messages import ReportReply
from devsched.protocol.transport import DEFAULT_MAX_PAYLOAD_BYTES, NoReply

logger = logging.getLogger(__name__)

#: Bytes of a `reports` request around its entries (`{"reports":[...]}`).
_ENVELOPE_BYTES = len(b'{"reports":[]}')


class ReportingClient(Protocol):
    """What the batcher needs of the host's client (`HostClient`)."""

    #: Whether the scheduler said it serves `reports`; the batcher clears it when nothing does.
    reports: bool

    async def report(self, body: bytes) -> ReportReply:
        """One encoded report's `report`."""
        ...

    async def report_several(self, bodies: Sequence[bytes]) -> list[tuple[str, ReportReply | DevschedError]]:
        """One `reports` request: each report's spool key and its reply or error, in order."""
        ...


def unserved(exc: BaseException) -> bool:
    """Whether a failed `reports` request means the scheduler does not take it (report one by one instead)."""
    if isinstance(exc, NoReply):
        return exc.details.get("reason") == "no_responders"
    return isinstance(exc, NotFound)


def transient(exc: BaseException) -> DevschedError:
    """The error each caller gets for a request that failed as a whole: never one that ends a report."""
    if isinstance(exc, DevschedError) and not isinstance(exc, Conflict | NotFound | InvalidRequest | TooLarge):
        err = type(exc)(exc.message)
        err.details = dict(exc.details)
        return err
    return Unavailable(f"reports request failed: {type(exc).__name__}")


@dataclass(frozen=True, slots=True)
class _Waiting:
    """A report waiting for its batch, and its sender's context (its attempt's trace and log fields)."""

    key: str
    body: bytes
    future: asyncio.Future[ReportReply]
    context: contextvars.Context


class ReportBatcher:
    """Sends one host's reports together; see the module docstring."""

    def __init__(
        self,
        client: ReportingClient,
        *,
        max_batch: int = MAX_REPORTS_PER_REQUEST,
        max_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
    ) -> None:
        if not 1 <= max_batch <= MAX_REPORTS_PER_REQUEST:
            raise ValueError(f"max_batch must be in [1, {MAX_REPORTS_PER_REQUEST}], got {max_batch}")
        self._client = client
        self._max_batch = max_batch
        self._max_bytes = max_bytes
        self._waiting: list[_Waiting] = []
        self._flusher: asyncio.Task[None] | None = None

    async def report(self, key: str, body: bytes) -> ReportReply:
        """Send the report spooled under `key` as `body` with the next batch (by `report` where not served).

        Raises:
            DevschedError: the report's own error (as `report` raises it), or the batch's as a transient one.
            NoReply: as `report` raises it, for the report or for its batch.
        """
        if not self._client.reports:
            return await self._client.report(body)
        future: asyncio.Future[ReportReply] = asyncio.get_running_loop().create_future()
        self._waiting.append(_Waiting(key, body, future, contextvars.copy_context()))
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush(), name="reports")
        return await future

    async def _flush(self) -> None:
        """Send batches while reports wait; each batch takes what waits when the previous one is answered."""
        await asyncio.sleep(0)  # the reports sent in this loop turn go in the same request
        while self._waiting:
            batch = self._take()
            if batch:
                chunks = self._chunks(batch)
                # a request continues the trace of its first report (one request has one trace context)
                await asyncio.gather(*(asyncio.create_task(self._send(c), context=c[0].context) for c in chunks))

    def _take(self) -> list[_Waiting]:
        """The waiting reports still wanted, each attempt once (a repeat waits for the next batch)."""
        batch: list[_Waiting] = []
        later: list[_Waiting] = []
        seen: set[str] = set()
        for waiting in self._waiting:
            if waiting.future.done():  # its caller gave up (shutdown, cancellation): the report stays spooled
                continue
            (later if waiting.key in seen else batch).append(waiting)
            seen.add(waiting.key)
        self._waiting = later
        return batch

    def _chunks(self, batch: list[_Waiting]) -> list[list[_Waiting]]:
        """`batch` in requests of at most `max_batch` reports and `max_bytes` bytes (a report fits alone)."""
        chunks: list[list[_Waiting]] = []
        chunk: list[_Waiting] = []
        used = _ENVELOPE_BYTES
        for waiting in batch:
            size = len(waiting.body) + 1  # and its comma
            if chunk and (len(chunk) >= self._max_batch or used + size > self._max_bytes):
                chunks.append(chunk)
                chunk, used = [], _ENVELOPE_BYTES
            chunk.append(waiting)
            used += size
        if chunk:
            chunks.append(chunk)
        return chunks

    async def _send(self, chunk: list[_Waiting]) -> None:
        if len(chunk) == 1 or not self._client.reports:
            await self._one_by_one(chunk)
            return
        try:
            answers = await self._client.report_several([waiting.body for waiting in chunk])
        except Exception as exc:
            if unserved(exc):
                if self._client.reports:
                    self._client.reports = False  # until a register or heartbeat reply says so again
                    logger.warning("reports not served, reporting one by one", extra={"error": repr(exc)})
                await self._one_by_one(chunk)
                return
            if isinstance(exc, InvalidRequest | TooLarge):  # each report then meets its own answer
                logger.warning("reports request refused whole, reporting one by one", extra={"code": exc.code})
                await self._one_by_one(chunk)
                return
            for waiting in chunk:
                if not waiting.future.done():
                    waiting.future.set_exception(transient(exc))
            return
        if [key for key, _ in answers] != [waiting.key for waiting in chunk]:
            mismatch = "a reports reply that does not answer the reports sent, in their order"
            answers = [(waiting.key, Internal(mismatch)) for waiting in chunk]
        for waiting, (_, answer) in zip(chunk, answers, strict=True):
            future = waiting.future
            if future.done():
                continue
            if isinstance(answer, DevschedError):
                future.set_exception(answer)
            else:
                future.set_result(answer)

    async def _one_by_one(self, chunk: list[_Waiting]) -> None:
        async def one(body: bytes, future: asyncio.Future[ReportReply]) -> None:
            try:
                reply = await self._client.report(body)
            except Exception as exc:
                if not future.done():
                    future.set_exception(exc)
                return
            if not future.done():
                future.set_result(reply)

        # each in its sender's context: the request continues that report's trace, as its `report` would
        await asyncio.gather(*(asyncio.create_task(one(w.body, w.future), context=w.context) for w in chunk))
