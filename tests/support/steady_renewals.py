"""An honest host that renews its lease while an attack runs, and what that cost it.

The attack tests share one measure of "another host is unaffected": none of its renewals fails and their p99
stays under a third of the lease's ttl (the agent renews at a third of the ttl, so a slower renewal risks the
lease).
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from support.scheduler_harness import TestHost, call

#: Renewals counted at least, however short the attack: a p99 of fewer says nothing.
MIN_RENEWALS = 10


@dataclass
class Renewals:
    """Each renewal's latency (seconds) and each failure (an error reply or no reply within the ttl)."""

    ttl_s: float
    latencies: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    @property
    def p99(self) -> float:
        """The 99th percentile latency."""
        return statistics.quantiles(self.latencies, n=100)[98]

    def assert_unaffected(self, who: str = "the honest host") -> str:
        """Fail unless every renewal succeeded within a third of the ttl at p99; a summary line otherwise."""
        assert self.failures == [], f"{who} lost renewals: {self.failures[:5]}"
        assert len(self.latencies) >= MIN_RENEWALS, f"{who} renewed only {len(self.latencies)} times"
        assert self.p99 < self.ttl_s / 3, f"{who}'s renewal p99 {self.p99:.3f} s"
        return (
            f"{who}: {len(self.latencies)} renewals, p50 {statistics.median(self.latencies) * 1000:.1f} ms, "
            f"p99 {self.p99 * 1000:.1f} ms, max {max(self.latencies) * 1000:.1f} ms"
        )


async def renew_until(
    host: TestHost, lease: Mapping[str, Any], ttl_s: float, done: Callable[[], bool], *, every_s: float = 0.1
) -> Renewals:
    """Renew `lease` through the host's own connection every `every_s` until `done()` (and at least
    `MIN_RENEWALS` times), each waiting at most the ttl."""
    renewals = Renewals(ttl_s)
    while not done() or len(renewals.latencies) < MIN_RENEWALS:
        started = time.monotonic()
        try:
            await call(host.nc, host.subject("renew"), lease, timeout=ttl_s)
        except Exception as exc:  # a 409 or no answer within the ttl: the lease is at risk
            renewals.failures.append(repr(exc))
        renewals.latencies.append(time.monotonic() - started)
        await asyncio.sleep(max(0.0, every_s - (time.monotonic() - started)))
    return renewals
