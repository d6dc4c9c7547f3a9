"""Following one task's events from the `<PU>_EVENTS` stream until it ends.

An ordered consumer (`devsched.client.reader`), filtered to `P.events.task.<task_id>` and delivering
everything the stream holds from the start, so a watch begun late still sees the whole history. Events are yielded
once each (deduplicated by `seq`, since two relays may publish one event twice) in the order the stream
delivers them, and the watch ends after the first event whose status is terminal.

The stream keeps events for a limited time (7 days by default). When a task ended so long ago that its
events are gone, or its last event is late, the watch does not wait forever: whenever the stream has
been quiet for a while it asks the scheduler for the task, and ends once the task is terminal and the
stream has stayed quiet for a moment more.

`stored_events` is the same read without the waiting: what the stream holds now (the dashboard's task page).
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import TYPE_CHECKING, Self

from nats.js import JetStreamContext

from devsched.client.errors import DevschedError, Unavailable
from devsched.client.reader import JetStreamReader, Ordered, StreamMissing
from devsched.core.errors import InvalidRequest
from devsched.core.status import TERMINAL, TaskStatus
from devsched.protocol.codec import decode
from devsched.protocol.messages import TaskEvent
from devsched.protocol.subjects import Subjects

if TYPE_CHECKING:
    from devsched.client.client import Client

#: Fetch the task's current status; the watch's fallback when the stream is quiet.
StatusProbe = Callable[[], Awaitable[TaskStatus]]

#: Seconds of quiet after which a watch asks for the task's status.
DEFAULT_IDLE_CHECK_S = 5.0
#: Seconds of quiet after which a watch of a terminal task ends without its terminal event.
TERMINAL_GRACE_S = 1.5
#: Seconds `stored_events` waits for the next stored event (one that aged out meanwhile never comes).
STORED_WAIT_S = 0.5
#: Most events `stored_events` reads.
STORED_MOST = 1000


class TaskWatch:
    """An async iterator of one task's `TaskEvent`s, ending after a terminal one.

    Use it as `async with client.watch(task_id) as events: async for event in events: ...`, which
    releases the consumer even when the loop is left early; a plain `async for` also works and releases
    it when the iteration ends or fails.
    """

    def __init__(
        self,
        js: JetStreamContext,
        subjects: Subjects,
        task_id: uuid.UUID,
        probe: StatusProbe,
        *,
        idle_check_s: float = DEFAULT_IDLE_CHECK_S,
    ) -> None:
        self.task_id = task_id
        self._reader = JetStreamReader(js)
        self._subjects = subjects
        self._probe = probe
        self._idle_check_s = idle_check_s
        self._sub: Ordered | None = None
        self._seen: set[int] = set()
        self._finished = False
        self._terminal_in_view = False
        #: The last event yielded, if any.
        self.last_event: TaskEvent | None = None

    @property
    def finished(self) -> bool:
        """Whether the watch has ended (terminal event seen, or the task found terminal)."""
        return self._finished

    async def open(self) -> None:
        """Check that the task exists and start the consumer (done by the first `__anext__` otherwise).

        Raises:
            NotFound: no such task.
            Unavailable: the events stream does not exist (no scheduler has ever run with this prefix).
        """
        if self._sub is not None or self._finished:
            return
        status = await self._probe()  # NotFound for an unknown task, before any consumer exists
        self._terminal_in_view = status in TERMINAL
        try:
            self._sub = await self._reader.open(self._subjects.events_stream, self._subjects.task_events(self.task_id))
        except StreamMissing:
            raise Unavailable(
                f"the events stream {self._subjects.events_stream} does not exist: is a scheduler running "
                f"with prefix {self._subjects.prefix!r}?"
            ) from None

    async def close(self) -> None:
        """Release the consumer; idempotent."""
        self._finished = True
        sub, self._sub = self._sub, None
        if sub is not None:
            await sub.close()

    async def __aenter__(self) -> Self:
        await self.open()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        await self.close()

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> TaskEvent:
        try:
            event = await self._next()
        except BaseException:
            await self.close()
            raise
        if event is None:
            await self.close()
            raise StopAsyncIteration
        return event

    async def _next(self) -> TaskEvent | None:
        if self._finished:
            return None
        await self.open()
        while True:
            assert self._sub is not None
            wait = TERMINAL_GRACE_S if self._terminal_in_view else self._idle_check_s
            msg = await self._sub.next(wait)
            if msg is None:
                if self._terminal_in_view:
                    return None  # the task has ended and the stream has nothing more for it
                self._terminal_in_view = await self._probe() in TERMINAL
                continue
            try:
                event = decode(TaskEvent, msg.data)
            except InvalidRequest:
                continue  # not an event of this protocol version: skip rather than fail the watch
            if event.seq in self._seen:
                continue
            self._seen.add(event.seq)
            self.last_event = event
            if event.status in TERMINAL:
                self._finished = True
            return event


async def stored_events(client: Client, task_id: uuid.UUID) -> list[TaskEvent]:
    """The task's events the stream holds now, by `seq`, each once; empty if there are none or NATS fails."""
    reader = JetStreamReader(client.nc.jetstream())
    try:
        msgs = await reader.stored(
            client.subjects.events_stream, client.subjects.task_events(task_id), wait=STORED_WAIT_S, most=STORED_MOST
        )
    except DevschedError:
        return []
    events: dict[int, TaskEvent] = {}
    for msg in msgs:
        with contextlib.suppress(DevschedError):
            event = decode(TaskEvent, msg.data)
            events.setdefault(event.seq, event)
    return [events[seq] for seq in sorted(events)]


async def collect(watch: TaskWatch) -> list[TaskEvent]:
    """Every event of a watch until it ends (for scripts and tests)."""
    events: list[TaskEvent] = []
    async with watch:
        async for event in watch:
            events.append(event)
    return events


__all__ = ["DEFAULT_IDLE_CHECK_S", "StatusProbe", "TaskWatch", "collect", "stored_events"]
