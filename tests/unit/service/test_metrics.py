"""`/metrics` on the health listener, over a real loopback socket, and the names a registry exports."""

from __future__ import annotations

import platform
from collections.abc import AsyncIterator
from importlib.metadata import version

import pytest
from prometheus_client import Counter, Histogram

from devsched.service.health import HealthServer, NotReady
from devsched.service.metrics import (
    FAST_BUCKETS,
    database_histogram,
    exported_names,
    new_registry,
    operation_observer,
    ready_gauge,
    serve_metrics,
)
from support.scrape import scrape

pytestmark = pytest.mark.unit


@pytest.fixture
async def server() -> AsyncIterator[HealthServer]:
    health = HealthServer("127.0.0.1", 0, service="test")
    await health.start()
    yield health
    await health.close()


async def test_metrics_serves_the_registry_and_the_readiness(server: HealthServer) -> None:
    registry = new_registry()
    hits = Counter("devsched_test_hits", "Hits.", ["code"], registry=registry)
    hits.labels("ok").inc(3)
    serve_metrics(server, registry, ready=ready_gauge(registry), component="test")
    failing = False

    async def check() -> None:
        if failing:
            raise NotReady("down")

    server.check("thing", check)
    scraped = await scrape(server.port)
    assert scraped.value("devsched_test_hits_total", code="ok") == 3
    assert scraped.value("devsched_ready", component="test") == 1
    assert (scraped.value("process_cpu_seconds_total") or 0) > 0
    failing = True
    server.readiness.cache_s = 0
    assert (await scrape(server.port)).value("devsched_ready", component="test") == 0


@pytest.mark.parametrize("distribution", ["devsched-scheduler", "devsched-sweeper", "devsched-agent"])
def test_every_registry_says_which_build_runs(distribution: str) -> None:
    registry = new_registry(distribution)
    labels = {"version": version(distribution), "python": platform.python_version()}
    assert registry.get_sample_value("devsched_build_info", labels) == 1
    assert [s.labels for f in registry.collect() for s in f.samples if s.name == "devsched_build_info"] == [labels]


def test_exported_names_list_every_series_even_without_samples() -> None:
    registry = new_registry()
    Counter("devsched_a", "A.", ["code"], registry=registry)
    Histogram("devsched_b_seconds", "B.", ["endpoint"], buckets=FAST_BUCKETS, registry=registry)
    names = exported_names(registry)
    assert {"devsched_a_total", "devsched_b_seconds_bucket", "devsched_b_seconds_count"} <= names
    assert "devsched_b_seconds_sum" in names
    assert "process_cpu_seconds_total" in names


def test_the_operation_observer_observes_by_operation() -> None:
    registry = new_registry()
    histogram = database_histogram(registry)
    observe = operation_observer(histogram)
    observe("submit", 0.002)
    observe("submit", 0.004)
    observe("claim", 0.001)
    count = registry.get_sample_value
    assert count("devsched_database_operation_seconds_count", {"operation": "submit"}) == 2
    assert count("devsched_database_operation_seconds_count", {"operation": "claim"}) == 1
    assert count("devsched_database_operation_seconds_bucket", {"operation": "submit", "le": "0.0025"}) == 1
