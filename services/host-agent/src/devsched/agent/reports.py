"""The host's report batcher: terminal reports ready together go to the scheduler in one `reports` request.

Batches form by the group commit of `devsched.agent.batching`, split at `MAX_REPORTS_PER_REQUEST` and at
the request payload limit; a report alone goes out as a plain `report`. Each report's entry is its spooled
bytes unchanged (every try of a report carries the identical bytes), and each caller gets its own
report's answer: the reply (a hand-over in it), or the error `report` would have raised for it, so
`Reporter.deliver` handles it exactly as a `report`'s answer (spool removal, moot, rejected, parked,
take_next). A failure of the whole request (no reply, 429, 5xx) reaches each caller as a transient error
of the same kind, never one that ends or rejects a report; a caller that gave up leaves its report
spooled. A `reports` request continues the trace of its first report (a request carries one trace
context); a report sent alone continues its own, as its `report` would.

Only for a scheduler that said `reports` in its register or heartbeat reply; one that does not find the
subject counts as not serving it. A request refused whole as invalid or too large goes out one `report`
each, so each report meets its own answer, and the flag stays. Releases are not batched: each goes to
`release` as before.
"""

from __future__ import annotations

import logging
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Protocol

from devsched.agent.batching import GroupCommit, Waiting, not_served, whole_failure
from devsched.core.errors import Conflict, DevschedError, Internal, InvalidRequest, NotFound, TooLarge
from devsched.core.limits import MAX_REPORTS_PER_REQUEST
from devsched.protocol.messages import ReportReply
from devsched.protocol.transport import DEFAULT_MAX_PAYLOAD_BYTES

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
    return not_served(exc, (NotFound,))


def transient(exc: BaseException) -> DevschedError:
    """The error each caller gets for a request that failed as a whole: never one that ends a report."""
    return whole_failure(exc, "reports", (Conflict, NotFound, InvalidRequest, TooLarge))


@dataclass(frozen=True, slots=True)
class _Report:
    """A report as spooled: its spool key and its encoded bytes."""

    key: str
    body: bytes


class ReportBatcher(GroupCommit[_Report, ReportReply]):
    """Sends one host's reports together; see the module docstring."""

    _name = "reports"
    _logger = logger
    _not_served = "reports not served, reporting one by one"
    _refused_whole = (InvalidRequest, TooLarge)
    _refused_warning = "reports request refused whole, reporting one by one"
    _min_batch = 2
    _callers_context = True

    def __init__(
        self,
        client: ReportingClient,
        *,
        max_batch: int = MAX_REPORTS_PER_REQUEST,
        max_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
    ) -> None:
        super().__init__(max_batch=max_batch, limit=MAX_REPORTS_PER_REQUEST)
        self._client = client
        self._max_bytes = max_bytes

    async def report(self, key: str, body: bytes) -> ReportReply:
        """Send the report spooled under `key` as `body` with the next batch (by `report` where not served).

        Raises:
            DevschedError: the report's own error (as `report` raises it), or the batch's as a transient one.
            NoReply: as `report` raises it, for the report or for its batch.
        """
        return await self._submit(_Report(key, body))

    def _chunks(self, batch: list[Waiting[_Report, ReportReply]]) -> list[list[Waiting[_Report, ReportReply]]]:
        """`batch` in requests of at most `max_batch` reports and `max_bytes` bytes (a report fits alone)."""
        chunks: list[list[Waiting[_Report, ReportReply]]] = []
        chunk: list[Waiting[_Report, ReportReply]] = []
        used = _ENVELOPE_BYTES
        for waiting in batch:
            size = len(waiting.item.body) + 1  # and its comma
            if chunk and (len(chunk) >= self._max_batch or used + size > self._max_bytes):
                chunks.append(chunk)
                chunk, used = [], _ENVELOPE_BYTES
            chunk.append(waiting)
            used += size
        if chunk:
            chunks.append(chunk)
        return chunks

    def _served(self) -> bool:
        return self._client.reports

    def _unserve(self) -> None:
        self._client.reports = False

    def _key(self, item: _Report) -> Hashable:
        return item.key

    async def _one(self, item: _Report) -> ReportReply:
        return await self._client.report(item.body)

    async def _request(self, items: list[_Report]) -> Sequence[ReportReply | DevschedError]:
        answers = await self._client.report_several([report.body for report in items])
        if [key for key, _ in answers] != [report.key for report in items]:
            mismatch = "a reports reply that does not answer the reports sent, in their order"
            return [Internal(mismatch) for _ in items]
        return [answer for _, answer in answers]

    def _unserved(self, exc: Exception) -> bool:
        return unserved(exc)

    def _transient(self, exc: Exception) -> DevschedError:
        return transient(exc)
