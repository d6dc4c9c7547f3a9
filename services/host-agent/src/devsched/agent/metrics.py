"""The agent's Prometheus metrics (`/metrics` on `metrics_port` of agent.toml).

Step duration by action and status (an action this agent does not have counts as `unknown`, so a plan
cannot make up label values), the renewal round trip, the spool's depth (reports waiting to be sent,
counted at each scrape: a directory listing of a few entries), and the reports parked after the
scheduler kept failing on them (`reporter.py`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from devsched.service.metrics import FAST_BUCKETS, STEP_BUCKETS, new_registry, ready_gauge

REGISTRY = new_registry("devsched-agent")
READY = ready_gauge(REGISTRY)
STEP_SECONDS = Histogram(
    "devsched_agent_step_duration_seconds",
    "Time one step of a plan ran, by action and how it ended (done, failed, timed_out, interrupted).",
    ["action", "status"],
    buckets=STEP_BUCKETS,
    registry=REGISTRY,
)
RENEWAL_SECONDS = Histogram(
    "devsched_agent_renewal_round_trip_seconds",
    "Time from sending a lease renewal to its granted reply.",
    buckets=FAST_BUCKETS,
    registry=REGISTRY,
)
REPORTS_PARKED = Counter(
    "devsched_agent_reports_parked",
    "Reports (and releases) no longer retried in this run after the scheduler kept failing on them "
    "(server errors for report_park_after_s); they stay in the spool and are sent again at the next start.",
    registry=REGISTRY,
)
#: The label value of a step whose action this agent does not have.
UNKNOWN_ACTION = "unknown"


class ParkedNow(Collector):
    """`devsched_agent_reports_parked_now`: reports parked in this run, still in the spool."""

    def __init__(self) -> None:
        #: Counts the parked reports; set once the agent has its reporter.
        self.count: Callable[[], int] | None = None

    def collect(self) -> Iterator[Metric]:
        """The gauge, read now."""
        family = GaugeMetricFamily(
            "devsched_agent_reports_parked_now", "Reports parked in this run, waiting in the spool for the next start."
        )
        if self.count is not None:
            family.add_metric([], self.count())
        yield family


class SpoolDepth(Collector):
    """`devsched_agent_spool_reports`: reports (and releases) in the spool, not yet answered by the scheduler."""

    def __init__(self) -> None:
        #: Counts the spool's reports; set once the agent holds its spool.
        self.depth: Callable[[], int] | None = None

    def collect(self) -> Iterator[Metric]:
        """The gauge, read now."""
        family = GaugeMetricFamily("devsched_agent_spool_reports", "Reports in the spool waiting to be sent.")
        if self.depth is not None:
            family.add_metric([], self.depth())
        yield family


SPOOL = SpoolDepth()
REGISTRY.register(SPOOL)
PARKED = ParkedNow()
REGISTRY.register(PARKED)
