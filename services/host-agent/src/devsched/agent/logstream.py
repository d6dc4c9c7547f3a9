"""Step output streamed live into `<PU>_LOGS`: one publisher per attempt, on the host's own subject.

`LogStreams.open` gives each attempt an `AttemptLog`: the runner's `RunLog` (its steps write into it as
they read their pipes, `logbatch.py`) and a task that publishes the attempt's records in order on
`P.host.<host_id>.log.<task_id>.<attempt>` with JetStream publish (acknowledged; `Nats-Msg-Id`
`<lease_id>.<seq>`, so a retried publish is stored once). Up to `WINDOW_BYTES` are in flight at once; a
record whose publish fails is sent again (the same id) after a backoff, so a record may be stored after a
later one, and readers order by `seq`.

Nothing here makes a step wait: a slow or absent NATS only fills the attempt's bounded buffer, and output
that does not fit is dropped and counted in the stream (`dropped` records). At the attempt's end
(`finish`) the agent waits for the rest to be stored, at most `log_flush_s` and, when publishing looks
hopeless (`LogHealth`), only while records are being stored, with the lease still renewed; what is left
then is given up and logged.

A record the stream refuses at its limits is given up, not sent again: a host's logs stream drops its own
oldest records when full, so it refuses only while closed because the host wrote past its output rate share
(the scheduler's output rate warden, for a cool-down). Nothing more is sent then, and the output records made
meanwhile are given up too (control records are kept); after a pause, and again until it is stored, one
`refused` record takes the first refused record's place, saying how many records and bytes were given up;
then publishing goes on. The steps, and the attempt's report, never wait for it.

An attempt that prints nothing sends nothing at first: its records (`step_end`s) are held back for
`quiet_s` (1 s) or until its first output, whichever comes first. One that ends within that without
printing anything, and neither gave its attempt back nor lost its lease, sends no record at all (its
steps' ends are in its report): two stored, fsync'd messages fewer for each short quiet attempt, and a
reader that follows it ends as for an attempt without an `end` record.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from nats.aio.client import Client
from nats.js.errors import APIError, NoStreamResponseError

from devsched.agent.logbatch import LogBatcher, LogLimits, Pending
from devsched.agent.runner import RunResult
from devsched.agent.steps import OutputSink
from devsched.agent.stop import StopReason, StopSignal
from devsched.core.backoff import backoff_delay
from devsched.protocol.logs import OutputStream
from devsched.protocol.plans import StepStatus
from devsched.protocol.subjects import MSG_ID_HEADER, Subjects, log_msg_id

logger = logging.getLogger(__name__)

#: How often `finish` looks again at whether waiting still helps (the wait itself ends when the last
#: record is stored).
_FINISH_CHECK_S = 0.1
#: Publish one message and wait for the stream's acknowledgement: `(subject, payload, headers)`; raises
#: when it is not stored (timeout, no stream, no connection).
Publish = Callable[[str, bytes, Mapping[str, str]], Awaitable[Any]]

#: Bytes of one attempt's records in flight at once (sent, not yet acknowledged): enough to keep a server
#: busy (a step printing 100 MiB at full speed is stored without drops on loopback), little enough that a
#: renewal queued behind them on the shared connection is not held up on a slow link.
WINDOW_BYTES = 1024 * 1024
#: Records in flight at once, whatever their size (a step printing a line at a time makes small ones).
WINDOW = 64
#: How long the records of an attempt that has printed nothing are held back (see the module docstring).
QUIET_S = 1.0
#: Backoff of a failed publish: from 50 ms up to 2 s.
_RETRY_BASE_S = 0.05
_RETRY_CAP_S = 2.0
#: JetStream's code for a publish a stream refused at its limits ("maximum messages exceeded"). A host's logs
#: stream drops its own oldest records instead, except while it is closed because the host wrote past its
#: output rate share (the scheduler closes it for a cool-down): such records are given up, not retried.
STREAM_REFUSED = 10077
#: How often the `refused` record is tried while the stream is closed: from 250 ms up to 2 s.
_PROBE_BASE_S = 0.25
_PROBE_CAP_S = 2.0


def refused_by_stream(error: BaseException | None) -> bool:
    """Whether `error` is the logs stream refusing a record (its host over its output rate share)."""
    return isinstance(error, APIError) and error.err_code == STREAM_REFUSED


class _Refusal:
    """Records refused since the last `refused` record was stored: where the first was, how many, how big."""

    __slots__ = ("bytes", "offset", "probes", "records", "seq")

    def __init__(self, pending: Pending) -> None:
        self.seq, self.offset = pending.seq, pending.offset
        self.records = self.bytes = self.probes = 0

    def add(self, pending: Pending) -> None:
        self.records += 1
        self.bytes += pending.size


def jetstream_publish(nc: Client, *, timeout_s: float) -> Publish:
    """`Publish` over `nc`: a JetStream publish, acknowledged within `timeout_s`."""
    js = nc.jetstream()

    async def publish(subject: str, payload: bytes, headers: Mapping[str, str]) -> Any:
        return await js.publish(subject, payload, timeout=timeout_s, headers=dict(headers))

    return publish


class _StepOutput:
    """One step's sink: its writes go into the attempt's batcher."""

    __slots__ = ("_index", "_log", "_name")

    def __init__(self, log: AttemptLog, name: str, index: int) -> None:
        self._log, self._name, self._index = log, name, index

    def write(self, stream: OutputStream, data: bytes) -> None:
        self._log.write(self._name, self._index, stream, data)


class AttemptLog:
    """One attempt's output on its way to the logs stream (see the module docstring)."""

    def __init__(
        self,
        batcher: LogBatcher,
        subject: str,
        lease_id: uuid.UUID | str,
        publish: Publish,
        *,
        health: LogHealth,
        context: Mapping[str, object] | None = None,
        quiet_s: float = QUIET_S,
    ) -> None:
        self.batcher = batcher
        self.subject = subject
        self._lease_id = str(lease_id)
        self._publish = publish
        self._health = health
        self._context = dict(context or {})
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._quiet_s = quiet_s
        self._hold_timer: asyncio.TimerHandle | None = None
        self._inflight: deque[tuple[Pending, asyncio.Task[Any]]] = deque()
        self._inflight_bytes = 0
        self._failures = 0
        #: Until when (monotonic) the records of an attempt that printed nothing are held back; None
        #: once they no longer are (output came, the time passed, or the end needs its records).
        self._hold_until: float | None = time.monotonic() + quiet_s if quiet_s > 0 else None
        #: Records taken from the batcher to publish so far.
        self.taken = 0
        #: When a record was last stored (monotonic); what `finish` measures progress by.
        self.last_stored = float("-inf")
        #: Records stored so far.
        self.stored = 0
        #: Records refused since the last `refused` record (the module docstring); None when none are.
        self._refusal: _Refusal | None = None

    # -- the runner's side (RunLog) ------------------------------------------------------------------

    def step(self, name: str, index: int) -> OutputSink:
        """The sink of one step."""
        return _StepOutput(self, name, index)

    def write(self, name: str, index: int, stream: OutputStream, data: bytes) -> None:
        """Take output of a step; returns at once."""
        self.batcher.output(name, index, stream, data)
        if self._task is None and self.batcher.output_bytes:
            self._publish_now()  # the first output ends the hold
        self._wake.set()

    def step_end(self, name: str, index: int, status: StepStatus, exit_code: int | None) -> None:
        """A step that ran has ended."""
        self.batcher.step_end(name, index, status, exit_code)
        self._wake.set()

    # -- the attempt's side --------------------------------------------------------------------------

    def start(self) -> AttemptLog:
        """Start publishing (in a task of the running loop), once the hold is over (the module docstring)."""
        if self._hold_until is None:
            self._publish_now()
        elif self._hold_timer is None and self._task is None:
            self._hold_timer = asyncio.get_running_loop().call_later(self._quiet_s, self._publish_now)
        return self

    def _publish_now(self) -> None:
        """End the hold and start the publisher, which takes the records.

        An attempt that prints nothing costs no task and no wake-ups until then (or at all).
        """
        self._hold_until = None
        self._cancel_hold_timer()
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"log {self.subject}")

    def _cancel_hold_timer(self) -> None:
        if self._hold_timer is not None:
            self._hold_timer.cancel()
            self._hold_timer = None

    async def finish(self, result: RunResult, stop: StopSignal, *, flush_s: float, stall_s: float) -> bool:
        """Write the end record and wait until every record is stored; whether all were.

        Waits `flush_s` at most (a NATS that is away for a moment gets that long to come back), and only
        while records are being stored (one within `stall_s`) when this host's publishing looks hopeless
        (no logs stream, or nothing ever stored): a missing stream must not delay every report.
        """
        halt = stop.halt
        lease_lost = halt is not None and halt[0] is StopReason.LEASE_LOST
        if self.taken == 0 and self._held() is not None and not (result.released or lease_lost):
            self.batcher.discard()  # quiet, and nothing sent yet: nothing is (the module docstring)
            self._cancel_hold_timer()
            self._wake.set()
            return True
        self.batcher.end(result.outcome, released=result.released, lease_lost=lease_lost, reason=result.reason)
        self._publish_now()
        self._wake.set()
        deadline = time.monotonic() + flush_s
        publishing = self._task
        while not self.done:
            now = time.monotonic()
            if now >= deadline or (self._health.hopeless and now - self.last_stored >= stall_s):
                break
            if publishing is None or publishing.done():  # nothing left that could store the rest
                break
            # The publisher returns once the last record is stored: woken by that, not by polling, so a
            # report waits for its output no longer than the stream takes to acknowledge it.
            await asyncio.wait({publishing}, timeout=min(_FINISH_CHECK_S, deadline - now))
        done = self.done
        b = self.batcher
        # All stored, nothing lost: DEBUG (one line less per attempt); anything dropped or cut: INFO.
        level = logging.INFO if b.dropped_bytes or b.truncated or b.refused_records else logging.DEBUG
        if done and not logger.isEnabledFor(level):
            return done
        fields = {
            **self._context,
            "output_bytes": b.output_bytes,
            "sent_bytes": b.sent_bytes,
            "dropped_bytes": b.dropped_bytes,
            "truncated": b.truncated,
            "refused_records": b.refused_records,
            "refused_bytes": b.refused_bytes,
        }
        if done:
            logger.log(level, "step output stored", extra={**fields, "records": self.stored})
        else:
            logger.warning(
                "step output not all stored; the rest is given up",
                extra={**fields, "records": self.stored, "left": b.queued + b.unacked},
            )
        return done

    @property
    def done(self) -> bool:
        """Whether the end record is made and every record is stored or, refused, marked by a stored `refused`."""
        return self.batcher.done and self._refusal is None

    def close(self) -> None:
        """Stop publishing (what is not stored by now is given up)."""
        self._cancel_hold_timer()
        if self._task is not None:
            self._task.cancel()
        for _, sending in self._inflight:
            if sending.done() and not sending.cancelled():
                sending.exception()  # retrieved: a failure given up is not an error left unseen
            sending.cancel()
        self._inflight.clear()
        self._inflight_bytes = 0

    # -- publishing ----------------------------------------------------------------------------------

    def _send(self, pending: Pending) -> asyncio.Task[Any]:
        headers = {MSG_ID_HEADER: log_msg_id(self._lease_id, pending.seq)}
        return asyncio.ensure_future(self._publish(self.subject, pending.payload, headers))

    async def _run(self) -> None:
        try:
            await self._publish_all()
        except Exception:
            # Output goes on being read and dropped once the buffer is full: the steps are not affected.
            logger.exception("log publishing failed; the attempt's further output is not stored", extra=self._context)

    async def _publish_all(self) -> None:
        batcher, inflight = self.batcher, self._inflight
        while True:
            self._wake.clear()
            batcher.close_lingering()
            # once a record is refused, none is sent until the `refused` record is stored (`_mark_refused`)
            while self._refusal is None and self._room() and (pending := batcher.take()) is not None:
                inflight.append((pending, self._send(pending)))
                self._inflight_bytes += len(pending.payload)
                self.taken += 1
            if not inflight:
                if self._refusal is not None:
                    await self._mark_refused(self._refusal)
                    continue
                if batcher.done:
                    return
                await self._until_woken(batcher.linger_due(), None)
                continue
            pending, sending = inflight[0]
            if not sending.done():
                await self._until_woken(batcher.linger_due(), sending)
                continue
            error = None if sending.cancelled() else sending.exception()
            if refused_by_stream(error):
                inflight.popleft()
                self._inflight_bytes -= len(pending.payload)
                self._given_up(pending, error)
                continue
            if sending.cancelled() or error is not None:
                await self._retry(pending, error)
                continue
            inflight.popleft()
            self._inflight_bytes -= len(pending.payload)
            batcher.acked(pending)
            self.stored += 1
            self.last_stored = time.monotonic()
            self._health.stored()
            self._failures = 0

    def _given_up(self, pending: Pending, error: BaseException | None) -> None:
        """A record the stream refused: given up (never sent again), counted for the `refused` record."""
        self.batcher.refused(pending)
        self._health.failed(error)
        if self._refusal is None:
            self._refusal = _Refusal(pending)
            logger.warning(
                "the logs stream refuses this host's records (its output rate is over its share): "
                "they are given up, and a record saying so is written once it takes records again",
                extra={**self._context, "seq": pending.seq},
            )
        self._refusal.add(pending)

    async def _mark_refused(self, refusal: _Refusal) -> None:
        """Try the `refused` record once, after a pause: stored, publishing goes on; refused, it is tried again.

        It takes the first refused record's `seq` (and `Nats-Msg-Id`): a refused message is not stored, so its
        id is free, and nothing after it was sent meanwhile, so readers see it where the refused records were.
        """
        refusal.probes += 1
        await asyncio.sleep(backoff_delay(refusal.probes, base_s=_PROBE_BASE_S, cap_s=_PROBE_CAP_S))
        records, size = self.batcher.give_up_output()  # made while refused: they would only be refused in turn
        refusal.records += records
        refusal.bytes += size
        payload = self.batcher.refused_record(refusal.seq, refusal.offset, refusal.records, refusal.bytes)
        headers = {MSG_ID_HEADER: log_msg_id(self._lease_id, refusal.seq)}
        try:
            await self._publish(self.subject, payload, headers)
        except Exception as exc:  # refused again, or NATS away: tried again after the next pause
            self._health.failed(exc)
            return
        self._refusal = None
        self.stored += 1
        self.last_stored = time.monotonic()
        self._health.stored()
        logger.info(
            "the logs stream takes this host's records again; the refused ones are marked",
            extra={**self._context, "refused_records": refusal.records, "refused_bytes": refusal.bytes},
        )

    def _held(self) -> float | None:
        """Seconds the records are still held back for (the module docstring); None when they are not.

        The hold is over once the publisher runs (`_publish_now`), the first output came, or it timed out.
        """
        until = self._hold_until
        if until is None:
            return None
        left = until - time.monotonic()
        if left <= 0 or self.batcher.output_bytes:
            self._hold_until = None
            return None
        return left

    def _room(self) -> bool:
        """Whether another record may be sent before the first in flight is acknowledged."""
        return not self._inflight or (len(self._inflight) < WINDOW and self._inflight_bytes < WINDOW_BYTES)

    async def _retry(self, pending: Pending, error: BaseException | None) -> None:
        self._failures += 1
        self._health.failed(error)
        if self._failures == 1:
            logger.warning(
                "step output not stored yet; retrying",
                extra={**self._context, "seq": pending.seq, "error": repr(error)},
            )
        await asyncio.sleep(backoff_delay(self._failures, base_s=_RETRY_BASE_S, cap_s=_RETRY_CAP_S))
        self._inflight[0] = (pending, self._send(pending))

    async def _until_woken(self, due: float | None, sending: asyncio.Task[Any] | None) -> None:
        """Wait for new records (`write`), the head publish to end, or `due` seconds (the open record's linger)."""
        waiters: set[asyncio.Future[Any]] = {asyncio.ensure_future(self._wake.wait())}
        if sending is not None:
            waiters.add(sending)
        try:
            await asyncio.wait(waiters, timeout=due, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waiters:
                if waiter is not sending:
                    waiter.cancel()


class LogHealth:
    """How this host's log publishing fares, shared by its attempts.

    `hopeless` while publishing fails and either no stream takes the host's log subjects (an older
    scheduler, or `create_streams` off and no stream made) or no record was ever stored (permissions that
    lack the log subjects time out the same way): then an attempt's end waits only for records that are
    actually being stored.
    """

    def __init__(self) -> None:
        self.ever_stored = False
        self.failing = False
        self.no_stream = False

    @property
    def hopeless(self) -> bool:
        """Whether waiting for records looks pointless (see the class docstring)."""
        return self.failing and (self.no_stream or not self.ever_stored)

    def stored(self) -> None:
        """A record was stored."""
        self.ever_stored, self.failing, self.no_stream = True, False, False

    def failed(self, error: BaseException | None) -> None:
        """A publish failed with `error`."""
        self.failing = True
        self.no_stream = isinstance(error, NoStreamResponseError)


class LogStreams:
    """The host's log publishing: an `AttemptLog` per attempt, on the host's own log subjects."""

    def __init__(
        self,
        publish: Publish,
        subjects: Subjects,
        host_id: str,
        limits: LogLimits,
        *,
        flush_s: float,
        stall_s: float,
        quiet_s: float = QUIET_S,
    ) -> None:
        self._publish = publish
        self._subjects = subjects
        self._host_id = host_id
        self.limits = limits
        self.flush_s = flush_s
        self.stall_s = stall_s
        self.quiet_s = quiet_s
        self.health = LogHealth()

    def open(self, task_id: uuid.UUID, attempt: int, lease_id: uuid.UUID) -> AttemptLog:
        """The started log of one attempt."""
        return AttemptLog(
            LogBatcher(task_id, attempt, self.limits),
            self._subjects.host_log(self._host_id, task_id, attempt),
            lease_id,
            self._publish,
            health=self.health,
            context={"task_id": str(task_id), "attempt": attempt},
            quiet_s=self.quiet_s,
        ).start()

    async def finish(self, log: AttemptLog, result: RunResult, stop: StopSignal) -> bool:
        """`log.finish` with the host's bounds; never raises (the report must go whatever the log does)."""
        try:
            return await log.finish(result, stop, flush_s=self.flush_s, stall_s=self.stall_s)
        except Exception:
            logger.exception("ending the step output failed; the attempt is reported all the same")
            return False
