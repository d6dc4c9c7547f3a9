"""The dashboard's picture of the lab: sampled through the operator API, nudged by task events.

Every `refresh_s` the sampler asks the scheduler, as the CLI would, for the hosts, the queued tasks (up to
`queue_max`), the running ones and the newest few, and publishes an immutable `Snapshot` that every page
renders from: a page costs no request of its own, whatever the number of viewers. The device a running task
holds and its step are not in the task list: they come from one `tasks.get` per new attempt, then from the
task events (`P.events.task.*`, a plain subscription, no consumer), which also trigger an early sample so
that a change shows within a fraction of a second. The events feed the charts (`charts.Series`) and count
each device's task changes (`device_changes`), so that its page re-reads its history
(`P.api.tasks.list` by `device_id`) only when it changed.

Cost, with a deep queue (10,000 tasks): decoding a page of task summaries holds the event loop (about
50 µs a task), so pages are small (`PAGE_SIZE`: each decode is a short slice between page renders) and the
whole queue is re-read only every `refresh_s` at the soonest, and no more often than `QUEUE_DUTY` times its
own read time; in between, an event sample (hosts, running, newest) drops the tasks whose events say they
left the queue. Samples are spaced by their own cost too (`max(MIN_GAP_S, took)`), so a storm of events
never keeps the loop sampling.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime

from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from devsched.client import Client, DevschedError
from devsched.core.status import TERMINAL, TaskStatus
from devsched.protocol.codec import decode
from devsched.protocol.messages import HostView, TaskEvent, TaskSummary
from devsched.web.charts import Series
from devsched.web.views import Running, queue_order

log = logging.getLogger("devsched.web")

#: Newest tasks of any status shown under the queue (where a task is seen to end).
RECENT = 30
#: Task gets in flight at once when many new attempts appear together.
GET_CONCURRENCY = 16
#: Shortest pause between two samples, however many events arrive (a sample also waits as long as it took).
MIN_GAP_S = 0.25
#: Tasks per list request: a page's decode is one uninterrupted slice of the event loop.
PAGE_SIZE = 250
#: The whole queue is re-read no more often than this many times its last read took.
QUEUE_DUTY = 4.0


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Everything the lab, queue and charts pages show, as of `at`."""

    version: int = 0
    at: datetime = field(default_factory=lambda: datetime.now(UTC))
    hosts: list[HostView] = field(default_factory=list)
    queued: list[TaskSummary] = field(default_factory=list)
    queued_capped: bool = False
    running: list[TaskSummary] = field(default_factory=list)
    recent: list[TaskSummary] = field(default_factory=list)
    on_device: dict[str, Running] = field(default_factory=dict)
    progress: dict[str, Running] = field(default_factory=dict)
    error: str | None = None
    sample_ms: float = 0.0

    @property
    def ready(self) -> bool:
        """Whether a sample has been taken yet."""
        return self.version > 0


@dataclass(slots=True)
class _Held:
    device_id: str
    running: Running


class Sampler:
    """Keeps `snapshot` fresh; `run()` is its loop, `changed()` waits for the next snapshot."""

    def __init__(
        self,
        client: Client,
        *,
        refresh_s: float = 2.0,
        queue_max: int = 10000,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.client = client
        self.refresh_s = refresh_s
        self.queue_max = queue_max
        self.clock = clock
        self.snapshot = Snapshot()
        self.series = Series()
        self.device_changes: dict[str, int] = {}
        self._held: dict[str, _Held] = {}
        self._poke = asyncio.Event()
        self._changed = asyncio.Condition()
        self._sub: Subscription | None = None
        self._queued: list[TaskSummary] = []
        self._queued_capped = False
        self._queue_read_at = -float("inf")
        self._queue_read_s = 0.0
        self._left: set[str] = set()

    # -- events ----------------------------------------------------------------------------------------------

    async def subscribe(self) -> None:
        """Start following every task's events (core NATS: sees what is published from now on)."""
        self._sub = await self.client.nc.subscribe(self.client.subjects.task_events_all, cb=self._on_event)

    async def unsubscribe(self) -> None:
        """Stop following the events."""
        sub, self._sub = self._sub, None
        if sub is not None:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()

    async def _on_event(self, msg: Msg) -> None:
        try:
            event = decode(TaskEvent, msg.data)
        except DevschedError:
            return
        self.observe(event)
        self._poke.set()

    def observe(self, event: TaskEvent) -> None:
        """Fold one task event into the device map, the devices' change counts and the charts."""
        task_id = str(event.task_id)
        kind = str(event.event)
        held = self._held.get(task_id)
        if kind == "assigned" and event.device_id and event.attempt:
            name = held.running.name if held else None
            self._held[task_id] = _Held(event.device_id, Running(task_id, name, event.attempt))
        elif kind == "progress" and held and event.progress is not None and event.attempt == held.running.attempt:
            held.running = replace(held.running, progress=event.progress)
        if event.status in TERMINAL or kind == "requeued":
            self._held.pop(task_id, None)
        if event.status == TaskStatus.QUEUED:
            self._left.discard(task_id)
        else:
            self._left.add(task_id)  # out of the queue until the next full read says otherwise
        if event.status in TERMINAL:
            self.series.finished(str(event.status), event.at)
        device_id = event.device_id or (held.device_id if held else None)
        if device_id and kind in {"assigned", "dispatched", "requeued", "cancel_requested", *TERMINAL}:
            self.device_changes[device_id] = self.device_changes.get(device_id, 0) + 1

    # -- sampling --------------------------------------------------------------------------------------------

    async def run(self) -> None:
        """Sample until cancelled: every `refresh_s`, or soon after an event."""
        while True:
            started = time.monotonic()
            await self.sample()
            took = time.monotonic() - started
            # a slow sample spaces the next ones out rather than loading the scheduler and this event loop
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(self.refresh_s, 2 * took)):
                    await asyncio.sleep(max(MIN_GAP_S, took))
                    self._poke.clear()
                    await self._poke.wait()

    async def sample(self) -> Snapshot:
        """Take one sample and publish it (on failure, the previous picture with the error)."""
        started = time.monotonic()
        try:
            snapshot = await self._take()
        except DevschedError as exc:
            log.warning("sample failed: %s", exc)
            snapshot = replace(self.snapshot, error=str(exc), at=self.clock())
        snapshot = replace(snapshot, version=self.snapshot.version + 1, sample_ms=(time.monotonic() - started) * 1000)
        await self._publish(snapshot)
        return snapshot

    async def _take(self) -> Snapshot:
        hosts = await self.client.hosts()
        if self._queue_due():
            await self._read_queue()
        queued = [t for t in self._queued if str(t.task_id) not in self._left]
        running = [
            *await self._tasks(TaskStatus.ASSIGNED, 100000),
            *await self._tasks(TaskStatus.DISPATCHED, 100000),
        ]
        recent = (await self.client.list_page(limit=RECENT)).tasks
        await self._learn_devices(running)
        now = self.clock()
        self.series.depth(len(queued), now)
        on_device = {h.device_id: h.running for h in self._held.values()}
        return Snapshot(
            at=now,
            hosts=hosts,
            queued=queued,
            queued_capped=self._queued_capped,
            running=running,
            recent=recent,
            on_device=on_device,
            progress={task_id: h.running for task_id, h in self._held.items()},
        )

    def _queue_due(self) -> bool:
        """Whether the whole queue is to be read again (see the module's docstring)."""
        since = time.monotonic() - self._queue_read_at
        return since >= max(self.refresh_s, QUEUE_DUTY * self._queue_read_s)

    async def _read_queue(self) -> None:
        started = time.monotonic()
        self._left.clear()  # events from now on apply to what this read returns
        queued = await self._tasks(TaskStatus.QUEUED, self.queue_max + 1)
        self._queued_capped = len(queued) > self.queue_max
        self._queued = queue_order(queued[: self.queue_max])
        self._queue_read_at = time.monotonic()
        self._queue_read_s = self._queue_read_at - started

    async def _tasks(self, status: TaskStatus, most: int) -> list[TaskSummary]:
        found: list[TaskSummary] = []
        async for page in self.client.pages(status=status, page_size=PAGE_SIZE):
            found.extend(page.tasks)
            if len(found) >= most:
                break
        return found

    async def _learn_devices(self, running: list[TaskSummary]) -> None:
        """Ask for the device of each attempt not known yet; forget the tasks that stopped running."""
        by_id = {str(t.task_id): t for t in running}
        for task_id in [t for t in self._held if t not in by_id]:
            del self._held[task_id]
        unknown = [
            t for task_id, t in by_id.items()
            if task_id not in self._held or self._held[task_id].running.attempt != t.attempt_count
        ]  # fmt: skip
        gate = asyncio.Semaphore(GET_CONCURRENCY)

        async def learn(task: TaskSummary) -> None:
            async with gate:
                try:
                    view = await self.client.get(task.task_id)
                except DevschedError:
                    return
            if view.attempts and view.status not in TERMINAL:
                last = view.attempts[-1]
                running_now = Running(str(view.task_id), view.name, last.attempt, last.progress)
                self._held[str(view.task_id)] = _Held(last.device_id, running_now)

        await asyncio.gather(*(learn(t) for t in unknown))
        for task_id, held in self._held.items():  # names of attempts first seen by their `assigned` event
            task = by_id.get(task_id)
            if task is not None and held.running.name != task.name:
                held.running = replace(held.running, name=task.name)

    def poke(self) -> None:
        """Take the next sample soon (after an action)."""
        self._poke.set()

    async def _publish(self, snapshot: Snapshot) -> None:
        async with self._changed:
            self.snapshot = snapshot
            self._changed.notify_all()

    async def changed(self, after: int, timeout: float) -> Snapshot:  # noqa: ASYNC109
        """The snapshot once its version is past `after`, or the current one after `timeout` seconds."""
        async with self._changed:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await self._changed.wait_for(lambda: self.snapshot.version > after)
            return self.snapshot
