"""`/metrics` on the health listener, over a real loopback socket, and the names a registry exports."""

from __future__ import annotations

import gzip
import platform
from collections.abc import AsyncIterator
from importlib.metadata import version

import pytest
from prometheus_client import Counter, Histogram
from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics_families

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
from support.probes import http
from support.scrape import parse, scrape

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


#: What Prometheus sends: 3.x with UTF-8 names allowed, 2.49+ by default (`scrape_protocols`), and older 2.x.
PROMETHEUS_3 = (
    "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.5,"
    "application/openmetrics-text;version=0.0.1;q=0.4,text/plain;version=1.0.0;escaping=allow-utf-8;q=0.3,"
    "text/plain;version=0.0.4;q=0.2,*/*;q=0.1"
)
PROMETHEUS_2 = (
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
    "text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)
PROMETHEUS_OLD = "application/openmetrics-text; version=0.0.1,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
TEXT = "text/plain; version=0.0.4; charset=utf-8"
OPENMETRICS = "application/openmetrics-text; version=1.0.0; charset=utf-8"


@pytest.mark.parametrize(
    ("accept", "content_type"),
    [("", TEXT), ("*/*", TEXT), ("application/openmetrics-text", OPENMETRICS), (PROMETHEUS_3, OPENMETRICS),
     (PROMETHEUS_2, OPENMETRICS), (PROMETHEUS_OLD, TEXT)],
    ids=["none", "any (curl, promtool)", "openmetrics", "prometheus 3", "prometheus 2.49+", "older prometheus"],
)  # fmt: skip
async def test_metrics_answers_the_format_the_scraper_asks_for(
    server: HealthServer, accept: str, content_type: str
) -> None:
    registry = new_registry()
    Counter("devsched_test_hits", "Hits.", registry=registry).inc()
    serve_metrics(server, registry, ready=ready_gauge(registry), component="test")
    head = (
        f"GET /metrics HTTP/1.1\r\nHost: x\r\nAccept: {accept}\r\n\r\n"
        if accept
        else "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"
    )
    status, headers, body = await http(server.port, head.encode())
    assert status == 200
    assert headers["Content-Type"].startswith(content_type)
    text = body.decode()
    if content_type.startswith("application/openmetrics-text"):
        families = {f.name: f for f in openmetrics_families(text)}  # raises unless it is valid OpenMetrics
        assert text.endswith("# EOF\n")
        assert families["devsched_test_hits"].samples[0].value == 1
    else:
        assert parse(text).value("devsched_test_hits_total") == 1


async def test_metrics_can_be_restricted_to_the_series_named(server: HealthServer) -> None:
    registry = new_registry()
    Counter("devsched_test_hits", "Hits.", registry=registry).inc()
    serve_metrics(server, registry, ready=ready_gauge(registry), component="test")
    status, _, body = await http(server.port, b"GET /metrics?name[]=devsched_ready HTTP/1.1\r\nHost: x\r\n\r\n")
    assert status == 200
    assert parse(body.decode()).names() == {"devsched_ready"}


async def test_metrics_is_gzipped_when_asked_and_always_sized(server: HealthServer) -> None:
    registry = new_registry()
    Counter("devsched_test_hits", "Hits.", registry=registry).inc()
    serve_metrics(server, registry, ready=ready_gauge(registry), component="test")
    get = b"GET /metrics HTTP/1.1\r\nHost: x\r\nAccept-Encoding: gzip\r\n\r\n"
    status, headers, body = await http(server.port, get)
    assert (status, headers["Content-Encoding"], int(headers["Content-Length"])) == (200, "gzip", len(body))
    assert "Transfer-Encoding" not in headers
    assert parse(gzip.decompress(body).decode()).value("devsched_test_hits_total") == 1
    status, headers, body = await http(server.port, b"HEAD /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
    assert (status, body) == (200, b"")
    assert int(headers["Content-Length"]) > 0
    status, headers, _ = await http(server.port, b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
    assert status == 405


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
