"""The assignment loop: queued tasks onto free matching devices, in batches, through the store.

Most assignments happen inside the requests that make them possible: a submit places its task on a
free device, a report hands the device it frees to the next queued task (`Store.assign_inline`). A pass
of this loop runs only when something may be left: the store says an operation left work it could not
place (`Committed.assignable`: a queue longer than a request looks at, rows another transaction held, a
registration, a device back in service), the sweeper requeued tasks, or `assign_tick_s` passed (devices
coming out of their grace, hosts coming back online). Other wake-ups find nothing due and cost nothing.

Several replicas run it at once safely: the store locks free devices with SKIP LOCKED, locks the tasks it
chose with SKIP LOCKED (choosing again without those another replica took), and a unique index backs the
one-reservation-per-device rule, so two replicas never double-assign and never wait on each other.
"""

from __future__ import annotations

import logging
import time

from devsched.core.events import AttemptAssigned, TaskEvent
from devsched.core.status import EventKind
from devsched.scheduler.loops import Wakeup
from devsched.scheduler.spans import TRACER
from devsched.service import bind, mark_idle
from devsched.store import Committed, Store

log = logging.getLogger("devsched.scheduler.assigner")


class Assigner:
    """One pass assigns up to a batch, when one is due; the relay publishes the new attempts.

    `assigned` counts the attempts this process created, in passes and in requests alike.
    """

    def __init__(self, store: Store, wakeup: Wakeup, *, batch: int, tick: float) -> None:
        self._store = store
        self._wakeup = wakeup
        self._batch = batch
        self._tick = tick
        self._due = True
        self._next_tick = 0.0
        self.assigned = 0
        self.passes = 0

    def hint(self) -> None:
        """Ask for a pass soon: there may be work no request could place."""
        self._due = True
        self._wakeup.set()

    def on_commit(self, committed: Committed) -> None:
        """Hear of a commit of this process (the store's `on_commit`): log its new attempts, and hint."""
        for message in committed.messages:
            m = message.event
            if isinstance(m, TaskEvent) and m.event is EventKind.ASSIGNED:
                self.assigned += 1  # every new attempt, also one a report handed to its host (no `AttemptAssigned`)
            elif isinstance(m, AttemptAssigned):
                with bind(task_id=m.task_id, attempt=m.attempt, lease_id=m.lease_id, host_id=m.host_id):
                    log.info("assigned", extra={"device_id": m.device_id, "ttl_s": m.ttl_s})
        if committed.assignable:
            self.hint()

    async def step(self) -> bool:
        """Assign one batch if a pass is due; True when it was full (more may be assignable at once)."""
        now = time.monotonic()
        if not self._due and now < self._next_tick:
            return False  # woken for work the requests placed themselves
        self._due, self._next_tick = False, now + self._tick
        with TRACER.start_as_current_span("assign batch", attributes={"devsched.batch.limit": self._batch}) as span:
            try:
                messages = await self._store.assign(limit=self._batch)
            except BaseException:
                self._due = True
                raise
            span.set_attribute("devsched.batch.count", len(messages))
            if not messages:
                mark_idle(span)  # not exported: an idle scheduler would export a trace every tick
        self.passes += 1
        if len(messages) >= self._batch:
            self._due = True
            return True
        return False
