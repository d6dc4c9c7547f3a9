"""The assignment loop: queued tasks onto free matching devices, in batches, through the store.

Several replicas run it at once safely: the store locks queued tasks and free devices with SKIP LOCKED
and a unique index backs the one-reservation-per-device rule, so two replicas never double-assign and
never wait on each other (one that finds everything locked ends its pass empty-handed and sleeps until
the next wake-up or tick, rather than spinning).
"""

from __future__ import annotations

import logging

from devsched.scheduler.loops import Wakeup
from devsched.service import bind
from devsched.store import Store

log = logging.getLogger("devsched.scheduler.assigner")


class Assigner:
    """One pass assigns up to a batch; the relay is woken to publish the new attempts."""

    def __init__(self, store: Store, relay_wakeup: Wakeup, *, batch: int) -> None:
        self._store = store
        self._relay_wakeup = relay_wakeup
        self._batch = batch
        self.assigned = 0

    async def step(self) -> bool:
        """Assign one batch; True when it was full (more may be assignable at once)."""
        messages = await self._store.assign(limit=self._batch)
        if messages:
            self._relay_wakeup.set()
            self.assigned += len(messages)
        for m in messages:
            with bind(task_id=m.task_id, attempt=m.attempt, lease_id=m.lease_id, host_id=m.host_id):
                log.info("assigned", extra={"device_id": m.device_id, "ttl_s": m.ttl_s})
        return len(messages) >= self._batch
