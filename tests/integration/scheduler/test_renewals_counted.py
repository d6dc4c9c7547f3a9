"""A lease renewed in a `renewals` request counts in `devsched_renewals_total` by its code, as one renewed
by `renew` does (operations.md: "renewals and reports answered"): an agent that batches its renewals must
not make the counter go silent."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from nats.aio.client import Client as NatsClient

from devsched.scheduler.app import Scheduler
from devsched.scheduler.metrics import REGISTRY
from support.scheduler_harness import TestHost, plan, submit

pytestmark = pytest.mark.integration


def renewals_counted(code: str) -> float:
    return REGISTRY.get_sample_value("devsched_renewals_total", {"code": code}) or 0.0


async def test_each_lease_of_a_renewals_request_is_counted_by_its_code(
    scheduler: Scheduler, nc: NatsClient, subject_prefix: str, make_host: Callable[..., TestHost]
) -> None:
    host = make_host()
    await host.register("d1")
    await submit(nc, subject_prefix, plan=plan("flash"))
    a = await host.next_assignment()
    await host.request("claim", a.lease)
    ok, superseded = renewals_counted("ok"), renewals_counted("lease_superseded")
    stale = {**a.lease, "lease_id": "00000000-0000-4000-8000-000000000000"}
    reply = await host.request("renewals", {"leases": [a.lease]})
    assert "error" not in reply["leases"][0]
    reply = await host.request("renewals", {"leases": [stale]})
    assert reply["leases"][0]["error"]["code"] == "lease_superseded"
    assert renewals_counted("ok") == ok + 1
    assert renewals_counted("lease_superseded") == superseded + 1
