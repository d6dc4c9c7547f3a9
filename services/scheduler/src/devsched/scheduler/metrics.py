"""The scheduler's Prometheus metrics (`/metrics` on `DEVSCHED_METRICS_PORT`).

Three kinds, each as cheap as its place asks:

- Counted where it happens: request duration by endpoint (`request_timer`, from the typed handler's start
  to its reply), every reply by endpoint and status code (`reply_counter`), reply codes of renewals and
  reports and every 409 by code (`Replies`), database operations by operation (`Store.on_operation`). One
  histogram observation or counter increment is about a microsecond.
- Read from the database every `metrics_interval_s` by one loop (`Stats.refresh`, a few aggregate statements):
  queue depth and oldest age by priority band, tasks by status, hosts, devices by state, the outbox's lag;
  with `metrics_group_by`, the queue's and the devices' by the value of that label too (`GROUP`).
  A scrape reads the last values, so a scrape storm costs no query. Every replica exports the same values:
  dashboards and alerts take `max()` of these, never `sum()`.
- Latencies that end in this process (`Latencies`): submit → assigned when an assignment commits here, and
  assigned → claimed when a claim does, from the events the commit wrote (`Store.on_commit`). A start this
  process did not see (another replica's submit or assignment) is read in the next refresh, in one
  statement, so each latency is observed once, by the replica that committed its end.
"""

from __future__ import annotations

import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import TypeVar

from prometheus_client import Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from devsched.core.errors import DevschedError
from devsched.core.events import TaskEvent
from devsched.core.status import TERMINAL, EventKind
from devsched.protocol.transport import OK_STATUS
from devsched.service.metrics import (
    FAST_BUCKETS,
    WAIT_BUCKETS,
    database_histogram,
    new_registry,
    operation_observer,
    ready_gauge,
)
from devsched.store import Committed, Store
from devsched.store.stats import Gauges, Grouping

_K = TypeVar("_K")

REGISTRY = new_registry("devsched-scheduler")
READY = ready_gauge(REGISTRY)
DATABASE_SECONDS = database_histogram(REGISTRY)
REQUEST_SECONDS = Histogram(
    "devsched_request_duration_seconds",
    "Time from a request's arrival at its handler to its reply, by endpoint.",
    ["endpoint"],
    buckets=FAST_BUCKETS,
    registry=REGISTRY,
)
REQUESTS = Counter(
    "devsched_requests",
    "Requests answered, by endpoint and reply code (200, or the error's status: 400, 404, 409, 429, 500, ...).",
    ["endpoint", "code"],
    registry=REGISTRY,
)
CONFLICTS = Counter("devsched_conflicts", "409 replies, by error code.", ["code"], registry=REGISTRY)
RENEWALS = Counter("devsched_renewals", "Lease renewals answered, by code (ok or the error's).", ["code"],
                   registry=REGISTRY)  # fmt: skip
REPORTS = Counter("devsched_reports", "Attempt reports answered, by code (ok or the error's).", ["code"],
                  registry=REGISTRY)  # fmt: skip
LOG_CLOSINGS = Counter(
    "devsched_host_log_closings",
    "Times a host's logs stream was closed to new records for writing past its rate share, by host.",
    ["host_id"],
    registry=REGISTRY,
)
UPLOAD_REFUSALS = Counter(
    "devsched_host_upload_refusals",
    "Artifact commits refused for a host past its uploads rate share (nothing purged), by host.",
    ["host_id"],
    registry=REGISTRY,
)
SUBMIT_TO_ASSIGNED = Histogram(
    "devsched_submit_to_assigned_seconds",
    "Time from a task's submission to the assignment of an attempt (each attempt, from the submission).",
    buckets=WAIT_BUCKETS,
    registry=REGISTRY,
)
ASSIGNED_TO_CLAIMED = Histogram(
    "devsched_assigned_to_claimed_seconds",
    "Time from an attempt's assignment to its host's claim.",
    buckets=WAIT_BUCKETS,
    registry=REGISTRY,
)

#: The endpoints whose every reply is counted by code (`counted`).
_BY_CODE = {"host-renew": RENEWALS, "host-report": REPORTS}
OK = "ok"


class Replies:
    """Counts one endpoint's replies: its 409s by code, and for renew and report every reply by code.

    Told by `devsched.scheduler.api.observed`, the one wrapper around every handler, of each reply.
    """

    __slots__ = ("_by_code", "_ok")

    def __init__(self, name: str) -> None:
        self._by_code = _BY_CODE.get(name)
        self._ok = self._by_code.labels(OK) if self._by_code is not None else None

    def ok(self) -> None:
        """A success reply."""
        if self._ok is not None:
            self._ok.inc()

    def failed(self, exc: Exception) -> None:
        """An error reply: `exc`'s code for a `DevschedError`, `internal` for anything else."""
        if isinstance(exc, DevschedError):
            if exc.status == 409:
                CONFLICTS.labels(exc.code).inc()
            if self._by_code is not None:
                self._by_code.labels(exc.code).inc()
        elif self._by_code is not None:
            self._by_code.labels("internal").inc()


def request_timer(name: str) -> Callable[[float], None]:
    """What observes a request's duration (seconds) as endpoint `name`'s (`EndpointTally.observe`)."""
    return REQUEST_SECONDS.labels(name).observe


def reply_counter(name: str) -> Callable[[int], None]:
    """What counts endpoint `name`'s replies by status code (`EndpointTally.count`); its 200s exported from 0.

    The codes are the protocol errors' statuses, a fixed set, and `name` one of the endpoint table's.
    """
    children = {OK_STATUS: REQUESTS.labels(name, str(OK_STATUS)).inc}

    def count(status: int) -> None:
        inc = children.get(status)
        if inc is None:
            inc = children[status] = REQUESTS.labels(name, str(status)).inc
        inc()

    return count


class Latencies:
    """Submit → assigned and assigned → claimed, observed when their end commits in this process.

    Starts are remembered from the events this process commits (`on_commit`), at most `capacity` of each
    (the oldest forgotten first); an end whose start is not known waits for `resolve`, which reads the
    missing starts in one statement.
    """

    def __init__(self, capacity: int = 100_000) -> None:
        self.capacity = capacity
        self._created: OrderedDict[uuid.UUID, datetime] = OrderedDict()
        self._assigned: OrderedDict[tuple[uuid.UUID, int], datetime] = OrderedDict()
        #: Ends whose start is unknown here: (task, when assigned) and ((task, attempt), when claimed).
        self._assigned_unknown: list[tuple[uuid.UUID, datetime]] = []
        self._claimed_unknown: list[tuple[tuple[uuid.UUID, int], datetime]] = []

    def on_commit(self, committed: Committed) -> None:
        """Take the events a commit of this process wrote: remember starts, observe ends."""
        for message in committed.messages:
            event = message.event
            if type(event) is not TaskEvent:
                continue
            kind = event.event
            if kind is EventKind.SUBMITTED:
                self._remember(self._created, event.task_id, event.at)
            elif kind is EventKind.ASSIGNED and event.attempt is not None:
                created = self._created.get(event.task_id)
                if created is None:
                    if len(self._assigned_unknown) < self.capacity:  # bounded while the database is away
                        self._assigned_unknown.append((event.task_id, event.at))
                else:
                    SUBMIT_TO_ASSIGNED.observe(max(0.0, (event.at - created).total_seconds()))
                self._remember(self._assigned, (event.task_id, event.attempt), event.at)
            elif kind is EventKind.DISPATCHED and event.attempt is not None:
                key = (event.task_id, event.attempt)
                assigned = self._assigned.pop(key, None)
                if assigned is None:
                    if len(self._claimed_unknown) < self.capacity:
                        self._claimed_unknown.append((key, event.at))
                else:
                    ASSIGNED_TO_CLAIMED.observe(max(0.0, (event.at - assigned).total_seconds()))
            elif event.status in TERMINAL:
                self._created.pop(event.task_id, None)

    def _remember(self, starts: OrderedDict[_K, datetime], key: _K, at: datetime) -> None:
        starts[key] = at
        if len(starts) > self.capacity:
            starts.popitem(last=False)

    @property
    def unresolved(self) -> int:
        """Ends waiting for their start to be read."""
        return len(self._assigned_unknown) + len(self._claimed_unknown)

    async def resolve(self, store: Store, *, limit: int = 5000) -> None:
        """Read the starts of up to `limit` ends not known here, and observe those latencies."""
        assigned, self._assigned_unknown = self._assigned_unknown[:limit], self._assigned_unknown[limit:]
        claimed, self._claimed_unknown = self._claimed_unknown[:limit], self._claimed_unknown[limit:]
        if not assigned and not claimed:
            return
        starts = await store.starts(sorted({t for t, _ in assigned}), sorted({k for k, _ in claimed}))
        for task_id, at in assigned:
            if (created := starts.created.get(task_id)) is not None:
                SUBMIT_TO_ASSIGNED.observe(max(0.0, (at - created).total_seconds()))
        for key, at in claimed:
            if (made := starts.assigned.get(key)) is not None:
                ASSIGNED_TO_CLAIMED.observe(max(0.0, (at - made).total_seconds()))


#: The label of the queue and device gauges that `metrics_group_by` adds: the value of that label.
GROUP = "group"


class DatabaseGauges(Collector):
    """The gauges read from the database (`Store.gauges`), exported as last read; and the relay's count.

    Before the first reading the families are exported without samples (their names are still listed). A
    reading by group (`Gauges.grouped`) exports the queue and device gauges with a `GROUP` label: summed over
    it, they are the totals (`sum by (priority) (max by (priority, group) (...))` over replicas).
    """

    def __init__(self) -> None:
        self.gauges: Gauges | None = None
        #: How many outbox messages this process's relay published (None without a relay).
        self.published: Callable[[], int] | None = None

    def collect(self) -> Iterator[Metric]:
        """The families, from the last reading."""
        g = self.gauges
        grouped = g.grouped if g is not None else None
        by = [GROUP] if grouped is not None else []
        queued = GaugeMetricFamily(
            "devsched_queued_tasks", "Tasks waiting for a device, by priority band (max over replicas).",
            labels=["priority", *by],
        )  # fmt: skip
        oldest = GaugeMetricFamily(
            "devsched_queue_oldest_age_seconds", "Age of the oldest queued task, by priority band (0: none).",
            labels=["priority", *by],
        )  # fmt: skip
        tasks = GaugeMetricFamily("devsched_tasks", "Tasks kept, by status (max over replicas).", labels=["status"])
        hosts = GaugeMetricFamily(
            "devsched_hosts", "Hosts online, and offline hosts that still list devices.", labels=["state"]
        )
        devices = GaugeMetricFamily("devsched_devices", "Devices, by state (max over replicas).", labels=["state", *by])
        unsent = GaugeMetricFamily("devsched_outbox_unsent", "Outbox messages not yet marked published.")
        lag = GaugeMetricFamily(
            "devsched_outbox_lag_seconds", "Age of the oldest outbox message not yet marked published (0: none)."
        )
        refreshed = GaugeMetricFamily(
            "devsched_gauges_refreshed_timestamp_seconds", "When the database gauges were read (database clock)."
        )
        if grouped is not None:
            for (band, group), n in grouped.queued.items():
                queued.add_metric([band, group], n)
                oldest.add_metric([band, group], grouped.oldest_queued_s[band, group])
            for (state, group), n in grouped.devices.items():
                devices.add_metric([state, group], n)
        elif g is not None:
            for band, n in g.queued.items():
                queued.add_metric([band], n)
                oldest.add_metric([band], g.oldest_queued_s[band])
            for state, n in g.devices.items():
                devices.add_metric([state], n)
        if g is not None:
            for status, n in g.tasks.items():
                tasks.add_metric([status], n)
            hosts.add_metric(["online"], g.hosts_online)
            hosts.add_metric(["offline"], g.hosts_offline)
            unsent.add_metric([], g.outbox_unsent)
            lag.add_metric([], g.outbox_oldest_unsent_s)
            refreshed.add_metric([], g.at.timestamp())
        yield from (queued, oldest, tasks, hosts, devices, unsent, lag, refreshed)
        published = CounterMetricFamily(
            "devsched_outbox_published", "Outbox messages this process's relay published (acknowledged)."
        )
        if self.published is not None:
            published.add_metric([], self.published())
        yield published


DATABASE_GAUGES = DatabaseGauges()
REGISTRY.register(DATABASE_GAUGES)


class Stats:
    """The scheduler's periodic metrics pass: the database gauges, and the latencies waiting for a start."""

    def __init__(
        self,
        store: Store,
        latencies: Latencies,
        gauges: DatabaseGauges = DATABASE_GAUGES,
        *,
        grouping: Grouping | None = None,
    ) -> None:
        self._store = store
        self.latencies = latencies
        self._gauges = gauges
        #: The label the queue and device gauges are also counted by (`metrics_group_by`), if any.
        self.grouping = grouping

    async def refresh(self) -> bool:
        """One pass (a `WorkLoop` step); never more at once."""
        self._gauges.gauges = await self._store.gauges(self.grouping)
        await self.latencies.resolve(self._store)
        return False


def observe_store(store: Store) -> None:
    """Time `store`'s operations into `devsched_database_operation_seconds`."""
    store.on_operation = operation_observer(DATABASE_SECONDS)
