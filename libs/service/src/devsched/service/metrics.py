"""Prometheus metrics: `/metrics` on the health listener, and what every service exports alike.

Each service defines its metrics in its own module (`devsched.scheduler.metrics`, `devsched.sweeper.metrics`,
`devsched.agent.metrics`) on a registry of its own (`new_registry`), so that one process's exposition holds
its metrics only, and a test can list every name a service exports (`exported_names`) to check dashboards
and alerts against. Conventions: a `devsched_` prefix, base units (`_seconds`), `_total` counters, and only
bounded label values (endpoint, code, outcome, status, state, priority band, action, operation): never a
task, attempt, lease, host or device id.

`serve_metrics` adds `/metrics` to a `HealthServer`; a scrape also sets `devsched_ready{component}` from the
readiness verdict (cached as `/readyz`'s is), so that alerts can see readiness without the kubelet. The answer
is prometheus_client's own ASGI app (`make_asgi_app`): the text format 0.0.4 unless the scraper's `Accept`
asks for OpenMetrics (or text 1.0.0), gzip when `Accept-Encoding` allows it, and `?name[]=` restricts it to
the series named.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry, Gauge, Histogram, make_asgi_app
from prometheus_client.metrics_core import Metric
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector
from starlette.datastructures import MutableHeaders
from starlette.types import Message, Receive, Scope, Send

from devsched.service.health import HealthServer
from devsched.service.version import RUNTIME, python_version, service_version

#: Requests and database operations: 0.5 ms to 10 s.
FAST_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
#: Waits measured in the life of a task (queued, unclaimed): 10 ms to an hour.
WAIT_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0)
#: Steps of a plan: 100 ms to 4 hours.
STEP_BUCKETS = (0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 1800.0, 3600.0, 7200.0, 14400.0)

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
    """Serve `registry` on `health`'s `/metrics`, in the exposition format the scraper asks for.

    Each scrape first reads the readiness verdict (at most one evaluation a second, shared with `/readyz`)
    into `ready` (`ready_gauge`) for `component`.
    """
    health.route("/metrics", _Scrape(health, registry, ready.labels(component)))


class _Scrape:
    """`make_asgi_app(registry)` after setting the readiness gauge, its answer sent with its length.

    prometheus_client's app sends no `Content-Length` (uvicorn would chunk it): with it, a probe reading to the
    close and a HEAD see the size, as the other answers of the listener give it.
    """

    def __init__(self, health: HealthServer, registry: Collector, ready: Gauge) -> None:
        self.health = health
        self.ready = ready
        self.app = make_asgi_app(registry)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        verdict = await self.health.readiness.verdict()
        self.ready.set(1 if verdict.ready else 0)
        start: Message = {}

        async def send_sized(message: Message) -> None:
            if message["type"] == "http.response.start":
                start.update(message)  # sent with the body, once its length is known
                return
            if start:
                headers = MutableHeaders(scope={"headers": list(start.get("headers", []))})
                headers["content-length"] = str(len(message.get("body", b"")))
                await send({**start, "headers": headers.raw})
                start.clear()
            await send(message)

        await self.app(scope, receive, send_sized)


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
