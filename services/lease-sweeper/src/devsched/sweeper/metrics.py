"""The sweeper's Prometheus metrics (`/metrics` on `DEVSCHED_METRICS_PORT`): expirations, pruning, the database."""

from __future__ import annotations

import collections
from collections.abc import Sequence

from prometheus_client import Counter

from devsched.core.status import TaskStatus
from devsched.service.metrics import database_histogram, new_registry, operation_observer, ready_gauge
from devsched.store import ExpiredLease, Store

REGISTRY = new_registry("devsched-sweeper")
READY = ready_gauge(REGISTRY)
DATABASE_SECONDS = database_histogram(REGISTRY)
EXPIRATIONS = Counter(
    "devsched_lease_expirations",
    "Expired leases ended by the sweeper, by what became of the task (requeued, failed, cancelled).",
    ["outcome"],
    registry=REGISTRY,
)
PRUNED = Counter("devsched_pruned_tasks", "Ended tasks removed after the retention period.", registry=REGISTRY)

#: What became of a task whose lease expired, by the status the sweep left it in.
OUTCOMES = {TaskStatus.QUEUED: "requeued", TaskStatus.FAILED: "failed", TaskStatus.CANCELLED: "cancelled"}
for _outcome in OUTCOMES.values():
    EXPIRATIONS.labels(_outcome)  # exported at 0 from the start, so that increase() sees the first one


def count_expired(expired: Sequence[ExpiredLease]) -> None:
    """Count a sweep batch's expirations by outcome."""
    for status, count in collections.Counter(lease.task_status for lease in expired).items():
        EXPIRATIONS.labels(OUTCOMES.get(status, status.value)).inc(count)


def observe_store(store: Store) -> None:
    """Time `store`'s operations into `devsched_database_operation_seconds`."""
    store.on_operation = operation_observer(DATABASE_SECONDS)
