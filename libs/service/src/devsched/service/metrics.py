"""Prometheus metrics: `/metrics` on the health listener, and what every service exports alike.

Each service defines its metrics in its own module (`devsched.scheduler.metrics`, `devsched.sweeper.metrics`,
`devsched.agent.metrics`) on a registry of its own (`new_registry`), so that one process's exposition holds
its metrics only, and a test can list every name a service exports (`exported_names`) to check dashboards
and alerts against. Conventions: a `devsched_` prefix, base units (`_seconds`), `_total` counters, and only
bounded label values (endpoint, code, outcome, status, state, priority band, action, operation): never a
task, attempt, lease, host or device id.

`serve_metrics` adds `/metrics` to a `HealthServer`; a scrape also sets `devsched_ready{component}` from the
readiness verdict (cached as `/readyz`'s is), so that alerts can see readiness without the kubelet.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.metrics_core import Metric
from prometheus_client.process_collector import ProcessCollector

from devsched.service.health import HealthServer, Response
from devsched.service.version import RUNTIME, python_version, service_version

#: Requests and database operations: 0.5 ms to 10 s.
FAST_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
#: Waits measured in the life of a task (queued, unclaimed): 10 ms to an hour.
WAIT_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0)
#: Steps of a plan: 100 ms to 4 hours.
STEP_BUCKETS = (0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 1800.0, 3600.0, 7200.0, 14400.0)

#: The text format 0.0.4, which every Prometheus reads (our names need nothing of 1.0.0's UTF-8 quoting).
CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4

#: The series suffixes each metric type exposes (for `exported_names`).
_SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_count", "_sum", "_created"),
    "summary": ("_count", "_sum", "_created"),
    "gauge": ("",),
    "info": ("_info",),
}


def new_registry(distribution: str = RUNTIME) -> CollectorRegistry:
    """A service's registry: the process's CPU, memory and file descriptors (`process_*`), and `build_info`.

    `distribution` is the service's (`devsched-scheduler`), whose version `devsched_build_info` reports.
    """
    registry = CollectorRegistry(auto_describe=True)
    ProcessCollector(registry=registry)
    build_info(registry, distribution)
    return registry


def build_info(registry: CollectorRegistry, distribution: str) -> Gauge:
    """`devsched_build_info{version,python}`, always 1: which release runs where, on which Python.

    `count by (version) (devsched_build_info)` shows a rollout's progress.
    """
    gauge = Gauge("devsched_build_info", "Always 1: the version of the service and of the Python it runs on.",
                  ["version", "python"], registry=registry)  # fmt: skip
    gauge.labels(service_version(distribution), python_version()).set(1)
    return gauge


def database_histogram(registry: CollectorRegistry) -> Histogram:
    """`devsched_database_operation_seconds{operation}`: each store operation (one transaction or statement).

    For the services with a store (scheduler, sweeper): hand its `observe` to `Store.on_operation`.
    """
    return Histogram(
        "devsched_database_operation_seconds",
        "Time of one store operation (one transaction, or statements), by operation, retries included.",
        ["operation"],
        buckets=FAST_BUCKETS,
        registry=registry,
    )


def operation_observer(histogram: Histogram) -> Callable[[str, float], None]:
    """The `Store.on_operation` hook observing into `histogram` (one child per operation, made once)."""
    children: dict[str, Callable[[float], None]] = {}

    def observe(operation: str, seconds: float) -> None:
        child = children.get(operation)
        if child is None:
            child = children[operation] = histogram.labels(operation).observe
        child(seconds)

    return observe


def ready_gauge(registry: CollectorRegistry) -> Gauge:
    """`devsched_ready{component}`: 1 while the service's readiness checks pass (set at each scrape)."""
    return Gauge("devsched_ready", "1 when every readiness check of the process passes, else 0.", ["component"],
                 registry=registry)  # fmt: skip


def serve_metrics(health: HealthServer, registry: CollectorRegistry, *, ready: Gauge, component: str) -> None:
    """Serve `registry` on `health`'s `/metrics` in the text exposition format.

    Each scrape first reads the readiness verdict (at most one evaluation a second, shared with `/readyz`)
    into `ready` (`ready_gauge`) for `component`.
    """
    child = ready.labels(component)

    async def metrics() -> Response:
        verdict = await health.readiness.verdict()
        child.set(1 if verdict.ready else 0)
        return Response(200, generate_latest(registry), CONTENT_TYPE)

    health.route("/metrics", metrics)


def exported_names(registry: CollectorRegistry) -> frozenset[str]:
    """Every series name `registry` can expose (`devsched_x_total`, `devsched_y_bucket`, ...), samples or not."""
    names: set[str] = set()
    for family in _families(registry):
        for suffix in _SUFFIXES.get(family.type, ("",)):
            names.add(family.name + suffix)
        names.update(sample.name for sample in family.samples)
    return frozenset(names)


def _families(registry: CollectorRegistry) -> Iterable[Metric]:
    return registry.collect()
