"""Terminal reports and releases: spooled before they are sent, resent with the identical bytes until answered.

A release (`P.host.<host_id>.release`: the attempt given back, at shutdown or after a crash) takes the same
path as a report and is answered the same way; the table holds for both. Reports ready together may go in
one `reports` request (`ReportBatcher`): each is still answered on its own, and handled by this table.

| answer | what happens to the spooled report |
| --- | --- |
| recorded, or duplicate | removed |
| 409 (expired, superseded, foreign, terminal, outcome conflict) | removed: the report is moot |
| 409 `cancel_not_requested`, 400, 413 | moved to `rejected/`: it can never be accepted as it is |
| 404 | the host is re-registered and the report retried; after a few, moved to `rejected/` |
| no reply, 503, connection trouble | retried with capped exponential backoff and jitter |
| 500 (`internal`, or an unknown server error) | retried so for `park_after_s` of such errors in a row; then parked |

A report whose delivery is given up (the agent is shutting down) stays in the spool for the next start.

A parked report is one the scheduler keeps failing on: not an outage (no reply, 503), which is waited
out however long it lasts, but a server error that says the scheduler took the report and could not
handle it. Hammering it would only repeat the error; it stays in the spool (never lost), the agent says so
(`parked`, the `reports` readiness check, `devsched_agent_reports_parked`), and the next start of the
agent sends it again, once, with the same limit: by then the scheduler may have been fixed.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Awaitable, Callable

from devsched.agent.client import HostClient
from devsched.agent.metrics import REPORTS_PARKED
from devsched.agent.reports import ReportBatcher
from devsched.agent.spool import Spool, SpooledReport, release_key, report_key
from devsched.core.backoff import backoff_delay, retry_after
from devsched.core.errors import (
    CancelNotRequested,
    Conflict,
    DevschedError,
    Internal,
    InvalidRequest,
    NotFound,
    TooLarge,
)
from devsched.protocol.codec import decode, encode
from devsched.protocol.messages import (
    ReleaseReply,
    ReleaseRequest,
    ReportReply,
    ReportRequest,
    RunResult,
    StepResult,
)
from devsched.protocol.transport import DEFAULT_MAX_PAYLOAD_BYTES

logger = logging.getLogger(__name__)

#: 404s in a row (each after a re-registration) before a report is put aside.
MAX_NOT_FOUND = 3

#: Default of how long a report is retried while the scheduler answers it with server errors (agent.toml
#: `report_park_after_s`).
PARK_AFTER_S_DEFAULT = 600.0


def is_server_error(exc: BaseException) -> bool:
    """Whether the scheduler answered with a server error: it failed on this request (500, `internal`).

    Not an outage: no reply (`NoReply`, raised here, never answered) and 503 (`unavailable`) are waited out.
    """
    return isinstance(exc, Internal)


#: Told of the reply to a recorded report or release, and when the try it answers was sent (monotonic).
Answered = Callable[[ReportReply | ReleaseReply, float], Awaitable[None]]

#: In the bytes of a report that asks for the next attempt (`ReportRequest.take_next`, left out when false).
_TAKE_NEXT = b'"take_next"'


def encode_report(report: ReportRequest | ReleaseRequest, limit: int = DEFAULT_MAX_PAYLOAD_BYTES) -> bytes:
    """The report's (or release's) bytes, shortened until they fit.

    Output tails go first (evenly, from their start); then, if the steps' test results summaries still do
    not fit, their lists of failing tests (evenly, from their end: the counts stay whole).
    """
    body = encode(report)
    if len(body) <= limit or report.result is None:
        return body
    steps = list(report.result.steps)
    keep = max((len(s.output_tail or "") for s in steps), default=0)
    while len(body) > limit and keep > 0:
        keep //= 2
        steps = [
            s.model_copy(update={"output_tail": s.output_tail[-keep:] if keep else ""}) if s.output_tail else s
            for s in report.result.steps
        ]
        body = encode(report.model_copy(update={"result": RunResult(steps=steps)}))
    listed = max((len(s.results.failed) for s in steps if s.results is not None), default=0)
    trimmed = steps
    while len(body) > limit and listed > 0:
        listed //= 2
        trimmed = [_listing(s, listed) for s in steps]
        body = encode(report.model_copy(update={"result": RunResult(steps=trimmed)}))
    return body


def _listing(step: StepResult, keep: int) -> StepResult:
    """`step` with at most `keep` failing tests named in its results summary."""
    if step.results is None or len(step.results.failed) <= keep:
        return step
    return step.model_copy(update={"results": step.results.model_copy(update={"failed": step.results.failed[:keep]})})


#: The least time between two removals of answered reports: those answered meanwhile leave the spool together.
REMOVAL_WINDOW_S = 0.05


class _Removals:
    """Answered reports leave the spool together: at most one removal per window, those answered meanwhile share it.

    One thread hop and one sync of the spool's directory for a batch instead of one each (at a steady rate
    of short tasks, a hop per report cost a few per cent of the agent's CPU); a report answered after a
    quiet window leaves at once. Removing is no guarantee (a report left behind by a crash is resent and
    answered as a duplicate), so waiting for a batch delays nothing but the deliverer's return.
    """

    def __init__(self, spool: Spool, window_s: float = REMOVAL_WINDOW_S) -> None:
        self._spool = spool
        self._window_s = window_s
        #: When the latest removal started (loop time).
        self._last = -window_s
        self._queue: list[tuple[str, asyncio.Future[None]]] = []
        self._worker: asyncio.Task[None] | None = None

    async def remove(self, key: str) -> None:
        """Remove the report under `key` (with those queued meanwhile); raises what the removal raised."""
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queue.append((key, done))
        if self._worker is None or self._worker.done():
            self._worker = asyncio.create_task(self._drain())
        await done

    async def _drain(self) -> None:
        loop = asyncio.get_running_loop()
        while self._queue:
            wait = self._last + self._window_s - loop.time()
            if wait > 0:
                try:
                    await asyncio.sleep(wait)
                except BaseException:
                    for _, done in self._queue:
                        done.cancel()
                    raise
            self._last = loop.time()
            batch, self._queue = self._queue, []
            try:
                await asyncio.to_thread(self._spool.remove_all, [key for key, _ in batch])
            except Exception as exc:
                for _, done in batch:
                    if not done.done():
                        done.set_exception(exc)
            except BaseException:
                for _, done in [*batch, *self._queue]:
                    done.cancel()
                raise
            else:
                for _, done in batch:
                    if not done.done():
                        done.set_result(None)


class Reporter:
    """Delivers reports through the spool."""

    def __init__(
        self,
        client: HostClient,
        spool: Spool,
        *,
        on_not_found: Callable[[], Awaitable[None]] | None = None,
        base_backoff_s: float = 0.2,
        max_backoff_s: float = 30.0,
        park_after_s: float = PARK_AFTER_S_DEFAULT,
        parked: set[str] | None = None,
        batcher: ReportBatcher | None = None,
    ) -> None:
        self._client = client
        #: Sends reports ready together in one `reports` request; None: each by `report`.
        self._batcher = batcher
        self._park_after_s = park_after_s
        #: Spool keys of the reports parked in this run (kept in the spool, sent again at the next start);
        #: the agent's own set, which outlives a reconnection's reporter.
        self.parked: set[str] = set() if parked is None else parked
        self._spool = spool
        self._on_not_found = on_not_found
        self._base_backoff_s = base_backoff_s
        self._max_backoff_s = max_backoff_s
        self._kick = asyncio.Event()
        self._removals = _Removals(spool)

    def kick(self) -> None:
        """Retry every waiting report now: the scheduler just answered another request, so it is back."""
        self._kick.set()
        self._kick = asyncio.Event()

    async def store(self, report: ReportRequest) -> SpooledReport:
        """Write `report` to the spool (durably, before any send) and return what was stored."""
        return await self._store(report_key(str(report.task_id), report.attempt), encode_report(report))

    async def store_release(self, release: ReleaseRequest) -> SpooledReport:
        """Write `release` to the spool (durably, before any send) and return what was stored."""
        return await self._store(release_key(str(release.task_id), release.attempt), encode_report(release))

    def encoded(self, report: ReportRequest | ReleaseRequest) -> tuple[str, bytes]:
        """The spool key and bytes of a report or release (what `put_now` takes)."""
        if isinstance(report, ReleaseRequest):
            return release_key(str(report.task_id), report.attempt), encode_report(report)
        return report_key(str(report.task_id), report.attempt), encode_report(report)

    async def _store(self, key: str, body: bytes) -> SpooledReport:
        return await asyncio.to_thread(self.put_now, key, body)

    def put_now(self, key: str, body: bytes) -> SpooledReport:
        """Write an encoded report to the spool, blocking: for a thread that does the attempt's other file work."""
        try:
            path = self._spool.put(key, body)
        except OSError as exc:
            # Sending it still beats losing it; only a restart before the answer would lose it now.
            logger.error("report could not be spooled; sending it anyway", extra={"spool_key": key, "error": repr(exc)})
            return SpooledReport(key, body, None)
        return SpooledReport(key, body, path)

    async def pending(self) -> list[SpooledReport]:
        """Reports left in the spool (by an earlier run of the agent, or given up at shutdown), but those parked."""
        pending = await asyncio.to_thread(self._spool.pending)
        return [report for report in pending if report.key not in self.parked]

    async def deliver(
        self,
        spooled: SpooledReport,
        *,
        give_up: asyncio.Event | None = None,
        answered: Answered | None = None,
    ) -> ReportReply | ReleaseReply | None:
        """Send until the scheduler answers, or `give_up` is set (then the report stays spooled).

        `answered` hears of the reply (and when the try it answers was sent, monotonic) before the report
        leaves the spool: what it records of the reply (an attempt handed over) is then on disk before the
        report that would bring it again is gone. A report asking for the next attempt (`take_next`) refused
        as invalid (a scheduler that does not know the field after all, such as an older one answering
        during a rolling upgrade) is spooled again without it and sent again.

        Returns:
            The reply when the report was recorded (or was a duplicate); None otherwise.
        """
        key, body = spooled.key, spooled.body
        send: Callable[[bytes], Awaitable[ReportReply | ReleaseReply]]
        if spooled.is_release:
            send = self._client.release
        elif self._batcher is not None:
            send = functools.partial(self._batcher.report, key)
        else:
            send = self._client.report
        failures = not_found = 0
        #: When the current run of server errors began (monotonic); None while there is none.
        failing_since: float | None = None
        while True:
            pause = 0.0
            sent_at = time.monotonic()
            try:
                reply: ReportReply | ReleaseReply = await send(body)
            except (InvalidRequest, TooLarge, CancelNotRequested) as exc:
                if isinstance(exc, InvalidRequest) and not spooled.is_release and _TAKE_NEXT in body:
                    self._client.take_next = False  # until a register or heartbeat reply says so again
                    logger.warning(
                        "report taking the next attempt refused, reporting without", extra={"spool_key": key}
                    )
                    body = await asyncio.to_thread(self._without_take_next, key, body)
                    continue
                await self._reject(key, exc)
                return None
            except Conflict as exc:
                logger.warning("report is moot", extra={"spool_key": key, "code": exc.code, "error": exc.message})
                await asyncio.to_thread(self._spool.remove, key)
                return None
            except NotFound as exc:
                not_found += 1
                if not_found >= MAX_NOT_FOUND:
                    await self._reject(key, exc)
                    return None
                if self._on_not_found is not None:
                    with contextlib.suppress(Exception):
                        await self._on_not_found()
            except Exception as exc:
                pause = retry_after(exc)
                if not is_server_error(exc):
                    failing_since = None
                elif failing_since is None:
                    failing_since = sent_at
                elif time.monotonic() - failing_since >= self._park_after_s:
                    self._park(key, exc, failures + 1)
                    return None
                logger.warning(
                    "report not answered, will retry",
                    extra={"spool_key": key, "error": _describe(exc), "failures": failures + 1},
                )
            else:
                logger.info(
                    "release recorded" if spooled.is_release else "report recorded",
                    extra={"spool_key": key, "status": reply.status.value, "duplicate": reply.duplicate},
                )
                if answered is not None:
                    try:
                        await answered(reply, sent_at)
                    except Exception:  # the report is recorded; what the reply handed over waits for its lease
                        logger.exception("reply of a recorded report not taken", extra={"spool_key": key})
                await self._removals.remove(key)
                return reply
            failures += 1
            delay = max(backoff_delay(failures, base_s=self._base_backoff_s, cap_s=self._max_backoff_s), pause)
            # A 429 is not an outage: a kick (another request answered) must not cut its pause short.
            if await _wait(give_up, delay, None if pause else self._kick):
                logger.warning("report left in the spool", extra={"spool_key": key})
                return None

    def _park(self, key: str, exc: BaseException, failures: int) -> None:
        self.parked.add(key)
        REPORTS_PARKED.inc()
        logger.error(
            "report parked: the scheduler kept failing on it; kept in the spool, sent again at the next start",
            extra={"spool_key": key, "error": _describe(exc), "failures": failures, "after_s": self._park_after_s},
        )

    def _without_take_next(self, key: str, body: bytes) -> bytes:
        """The report spooled under `key` as `body`, spooled again without `take_next` (blocking)."""
        report = decode(ReportRequest, body).model_copy(update={"take_next": False})
        again = encode_report(report)
        self.put_now(key, again)
        return again

    async def _reject(self, key: str, exc: DevschedError) -> None:
        why = f"{exc.code}: {exc.message}"
        path = await asyncio.to_thread(self._spool.reject, key, why)
        logger.error("report can never be accepted; kept aside", extra={"spool_key": key, "error": why, "path": path})


def _describe(exc: BaseException) -> str:
    # A protocol error by its code (its message may quote what the report holds); anything else by its repr.
    return f"{exc.status}:{exc.code}" if isinstance(exc, DevschedError) else repr(exc)


async def _wait(event: asyncio.Event | None, seconds: float, kick: asyncio.Event | None = None) -> bool:
    """Sleep `seconds` unless `event` (True) or `kick` (False: retry now) is set first."""
    if event is not None and event.is_set():
        return True
    waits = [asyncio.ensure_future(e.wait()) for e in (event, kick) if e is not None]
    try:
        if waits:
            await asyncio.wait(waits, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
        else:
            await asyncio.sleep(seconds)
    finally:
        for w in waits:
            w.cancel()
    return event is not None and event.is_set()
