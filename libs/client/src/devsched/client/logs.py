"""Reading a task's step output from its host's `<PU>_LOGS_<host_id>` stream (`Client.logs`, `devsched logs`).

An attempt's records are read from the subject of the host that ran it, as the task view names it
(`P.host.<host_id>.log.<task_id>.<attempt>`): another host can only write under its own id, so it cannot
put lines into this attempt. They are read with an ordered consumer from the stream's start
(`devsched.client.reader`, which also holds the rules that let a NATS permission confine it), and
yielded in `seq` order, each once (a record whose publish was retried may be stored after a later one, or
twice).

Without `follow`, the reader yields what the stream holds now and ends. With `follow`, it goes on while
the attempt runs and ends at the attempt's `end` record, or, for an attempt that ended without one (its
agent was killed, or its records were lost), once the task view says the attempt is over and the stream
has been quiet for a moment; an attempt already over with nothing stored (a quiet one sends no records)
ends at once. Following the latest attempt (no attempt named) goes on to the next attempt
when the task is queued again, and ends with the task.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from types import TracebackType
from typing import Self

from nats.js import JetStreamContext

from devsched.client.errors import NotFound, Unavailable
from devsched.client.reader import JetStreamReader, Ordered, StreamMissing
from devsched.core.errors import InvalidRequest
from devsched.core.status import TERMINAL, AttemptStatus
from devsched.protocol.codec import decode
from devsched.protocol.messages import AttemptView, LogKind, LogRecord, TaskView
from devsched.protocol.subjects import Subjects

#: Fetch the task's current view: which host ran each attempt, and whether it is over.
TaskProbe = Callable[[], Awaitable[TaskView]]

#: Seconds of quiet after which a follow asks whether the attempt is still running.
IDLE_CHECK_S = 2.0
#: Seconds of quiet after which a follow of an attempt that is over ends without its end record.
QUIET_GRACE_S = 1.5
#: Seconds between looks at the task while a follow waits for its first (or next) attempt.
ATTEMPT_POLL_S = 0.5
#: Records held back waiting for a missing `seq` before the reader skips the gap.
MAX_HELD = 512


class _Reorder:
    """Records back in `seq` order, each once; a gap that does not fill is skipped (`flush`, `MAX_HELD`)."""

    def __init__(self) -> None:
        self.next = 1
        self.held: dict[int, LogRecord] = {}

    def push(self, record: LogRecord) -> list[LogRecord]:
        if record.seq < self.next or record.seq in self.held:
            return []  # a repeat
        self.held[record.seq] = record
        ready = self._ready()
        if len(self.held) > MAX_HELD:
            ready += self.flush()
        return ready

    def flush(self) -> list[LogRecord]:
        """Everything held, in order, skipping the gaps."""
        ready = [self.held.pop(seq) for seq in sorted(self.held)]
        if ready:
            self.next = ready[-1].seq + 1
        return ready

    def _ready(self) -> list[LogRecord]:
        ready = []
        while self.next in self.held:
            ready.append(self.held.pop(self.next))
            self.next += 1
        return ready


def latest_attempt(view: TaskView) -> AttemptView | None:
    """The task's latest attempt, if it has one."""
    return max(view.attempts, key=lambda a: a.attempt, default=None)


class LogReader:
    """An async iterator of one task's `LogRecord`s (see the module docstring).

    Use it as `async with client.logs(task_id) as records: async for record in records: ...`, which
    releases the consumer even when the loop is left early; a plain `async for` works too.
    """

    def __init__(
        self,
        js: JetStreamContext,
        subjects: Subjects,
        task_id: uuid.UUID,
        probe: TaskProbe,
        *,
        attempt: int | None = None,
        step: str | None = None,
        follow: bool = False,
        read_timeout_s: float = 5.0,
        idle_check_s: float = IDLE_CHECK_S,
        quiet_grace_s: float = QUIET_GRACE_S,
    ) -> None:
        self.task_id = task_id
        self._reader = JetStreamReader(js)
        self._subjects = subjects
        self._probe = probe
        self._attempt = attempt
        self._step = step
        self._follow = follow
        self._read_timeout_s = read_timeout_s
        self._idle_check_s = idle_check_s
        self._quiet_grace_s = quiet_grace_s
        self._sub: Ordered | None = None
        self._records: AsyncIterator[LogRecord] | None = None
        #: The attempt being read (its number), once known.
        self.current_attempt: int | None = None

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        await self.close()

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> LogRecord:
        if self._records is None:
            self._records = self._all()
        try:
            return await anext(self._records)
        except BaseException:
            await self.close()
            raise

    async def close(self) -> None:
        """Release the consumer; idempotent."""
        await self._unsubscribe()
        records, self._records = self._records, None
        if records is not None and hasattr(records, "aclose"):
            with contextlib.suppress(Exception):
                await records.aclose()

    async def _unsubscribe(self) -> None:
        sub, self._sub = self._sub, None
        if sub is not None:
            await sub.close()

    # -- which attempts --------------------------------------------------------------------------------

    async def _all(self) -> AsyncIterator[LogRecord]:
        view = await self._probe()  # NotFound for an unknown task, before any consumer exists
        number = self._attempt
        while True:
            attempt = await self._attempt_of(view, number)
            if attempt is None:
                return
            self.current_attempt = attempt.attempt
            async for record in self._read(attempt):
                if self._step is None or record.step is None or record.step == self._step:
                    yield record
            if not self._follow or self._attempt is not None:
                return
            number = attempt.attempt + 1
            view = await self._probe()

    async def _attempt_of(self, view: TaskView, number: int | None) -> AttemptView | None:
        """Attempt `number` (the latest when None); with `follow`, waits for it while the task goes on.

        Raises:
            NotFound: an attempt named by the caller that the task does not have.
        """
        while True:
            if number is None:
                found = latest_attempt(view)
            else:
                found = next((a for a in view.attempts if a.attempt == number), None)
            if found is not None:
                return found
            if number is not None and number == self._attempt:
                raise NotFound(f"task {self.task_id} has no attempt {number}", task_id=str(self.task_id))
            if not self._follow or view.status in TERMINAL:
                return None
            await asyncio.sleep(ATTEMPT_POLL_S)
            view = await self._probe()

    # -- one attempt -----------------------------------------------------------------------------------

    async def _open(self, attempt: AttemptView, subject: str) -> int:
        """Subscribe to the attempt's records (`self._sub`); how many are stored now.

        They are in the host's own stream; records written before it had one are in the retired shared
        stream `<PU>_LOGS`, read until they age out.

        Raises:
            Unavailable: neither stream exists.
        """
        own = self._subjects.host_logs_stream(attempt.host_id)
        for stream in (own, self._subjects.logs_stream):
            try:
                sub = await self._reader.open(stream, subject)
            except StreamMissing:
                continue
            if sub.stored or (stream == own and self._follow and attempt.status is AttemptStatus.ACTIVE):
                await self._unsubscribe()
                self._sub = sub
                return sub.stored
            if self._sub is None and stream == own:
                self._sub = sub  # empty, kept in case the shared stream holds nothing either
                continue
            await sub.close()
        if self._sub is None:
            raise Unavailable(
                f"the logs stream {own} does not exist: has host {attempt.host_id!r} registered with a "
                f"scheduler of this version and prefix {self._subjects.prefix!r}?"
            )
        return 0

    async def _read(self, attempt: AttemptView) -> AsyncIterator[LogRecord]:
        subject = self._subjects.host_log(attempt.host_id, self.task_id, attempt.attempt)
        try:
            stored = await self._open(attempt, subject)
            if stored == 0 and (not self._follow or attempt.status is not AttemptStatus.ACTIVE):
                return  # nothing stored, and nothing to wait for: an attempt over (a quiet one sends no records)
            async for record in self._records_of(attempt):
                yield record
        finally:
            await self._unsubscribe()

    async def _records_of(self, attempt: AttemptView) -> AsyncIterator[LogRecord]:
        order = _Reorder()
        over = attempt.status is not AttemptStatus.ACTIVE
        while True:
            assert self._sub is not None
            wait = self._wait(over)
            msg = await self._sub.next(wait)
            if msg is None:
                for record in order.flush():
                    yield record
                    if record.kind is LogKind.END:
                        return
                if not self._follow or over:
                    return
                over = await self._attempt_over(attempt.attempt)
                continue
            try:
                record = decode(LogRecord, msg.data)
            except InvalidRequest:
                continue  # not a record of this protocol version: skip rather than fail the read
            if record.task_id != self.task_id or record.attempt != attempt.attempt:
                continue  # the host wrote it under the wrong subject: not this attempt's
            for ready in order.push(record):
                yield ready
                if ready.kind is LogKind.END:
                    return
            if not self._follow and msg.metadata.num_pending == 0:
                for ready in order.flush():
                    yield ready
                return

    def _wait(self, over: bool) -> float:
        """How long to wait for the next record: the stored ones are there at once unless following."""
        if not self._follow:
            return self._read_timeout_s
        return self._quiet_grace_s if over else self._idle_check_s

    async def _attempt_over(self, number: int) -> bool:
        view = await self._probe()
        attempt = next((a for a in view.attempts if a.attempt == number), None)
        return attempt is None or attempt.status is not AttemptStatus.ACTIVE or view.status in TERMINAL


async def output_bytes(reader: LogReader) -> AsyncGenerator[bytes, None]:
    """The output bytes of every `output` record of a reader, as they come: what `devsched logs --raw` prints.

    The reader is opened here and closed when the iteration ends (or is closed).
    """
    async with reader:
        async for record in reader:
            if record.kind is LogKind.OUTPUT:
                yield record.content()


async def collect_output(reader: LogReader) -> bytes:
    """The output bytes of every `output` record of a reader, concatenated (for scripts and tests)."""
    return b"".join([chunk async for chunk in output_bytes(reader)])


__all__ = ["LogReader", "collect_output", "latest_attempt", "output_bytes"]
