"""Scraping `/metrics` over HTTP as Prometheus does, and reading samples out of the text exposition."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from support.probes import http


@dataclass(frozen=True)
class Scrape:
    """One scrape: every sample by name and labels, and the raw text."""

    text: str
    samples: Mapping[tuple[str, frozenset[tuple[str, str]]], float]

    def value(self, name: str, **labels: str) -> float | None:
        """The sample `name{labels}` (exactly these labels), or None when it is not exposed."""
        return self.samples.get((name, frozenset(labels.items())))

    def total(self, name: str, **labels: str) -> float:
        """The sum of the samples `name` whose labels include `labels` (0 when none)."""
        wanted = set(labels.items())
        return sum(v for (n, ls), v in self.samples.items() if n == name and wanted <= ls)

    def names(self) -> set[str]:
        """Every sample name exposed."""
        return {name for name, _ in self.samples}


def parse(text: str) -> Scrape:
    """Parse a text exposition (raises on malformed text)."""
    samples: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return Scrape(text, samples)


async def scrape(port: int) -> Scrape:
    """GET `/metrics` on 127.0.0.1:`port`; checks the status and the content type of the text format."""
    status, headers, body = await http(port, b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    assert status == 200, body[:300]
    assert headers["Content-Type"].startswith("text/plain; version=0.0.4"), headers
    return parse(body.decode())
