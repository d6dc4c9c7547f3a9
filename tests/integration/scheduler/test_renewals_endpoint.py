"""`P.host.<id>.renewals` over NATS: advertised in the register and heartbeat replies, one answer per lease in
the request's order (a grant, or the error `renew` would answer), bad lists refused whole, and a host can
renew only its own leases."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
from nats.aio.client import Client as NatsClient

from devsched.scheduler.app import Scheduler
from support.scheduler_harness import Assigned, ErrorReply, TestHost, check, get_task, plan, raw_request, submit

pytestmark = pytest.mark.integration


async def _running(host: TestHost, nc: NatsClient, prefix: str, count: int) -> list[Assigned]:
    running = []
    for _ in range(count):
        await submit(nc, prefix, plan=plan("flash"))
        a = await host.next_assignment()
        await host.claim(a)
        running.append(a)
    return running


async def test_register_and_heartbeat_say_renewals_are_served(
    scheduler: Scheduler, make_host: Callable[..., TestHost]
) -> None:
    host = make_host()
    assert (await host.register("d1"))["renewals"] is True
    assert (await host.request("heartbeat", {}))["renewals"] is True


async def test_each_lease_is_answered_in_order(
    scheduler: Scheduler, nc: NatsClient, subject_prefix: str, make_host: Callable[..., TestHost]
) -> None:
    host = make_host()
    await host.register("d1", "d2", "d3")
    first, second, third = (a.lease for a in await _running(host, nc, subject_prefix, 3))
    await host.request("report", {**third, "outcome": "done"})
    reply = await host.request("renewals", {"leases": [first, third, second]})
    outcomes = reply["leases"]
    assert [(o["task_id"], o["attempt"]) for o in outcomes] == [
        (lease["task_id"], lease["attempt"]) for lease in (first, third, second)
    ]
    assert outcomes[0]["ttl_s"] >= 1
    assert outcomes[0]["cancel_requested"] is False
    assert "error" not in outcomes[0]
    assert outcomes[1]["error"]["code"] == "task_terminal"
    assert "expires_at" not in outcomes[1]
    assert "error" not in outcomes[2]
    stale = {**first, "lease_id": "00000000-0000-4000-8000-000000000000"}
    (superseded,) = (await host.request("renewals", {"leases": [stale]}))["leases"]
    assert superseded["error"]["code"] == "lease_superseded"
    view = await get_task(nc, subject_prefix, str(second["task_id"]))
    assert view["attempts"][-1]["expires_at"] == outcomes[2]["expires_at"]


async def test_a_cancellation_is_in_its_own_lease_answer_only(
    scheduler: Scheduler, nc: NatsClient, subject_prefix: str, make_host: Callable[..., TestHost]
) -> None:
    host = make_host()
    await host.register("d1", "d2")
    first, second = (a.lease for a in await _running(host, nc, subject_prefix, 2))
    check(
        await raw_request(nc, f"{subject_prefix}.api.tasks.cancel", json.dumps({"task_id": first["task_id"]}).encode())
    )
    outcomes = (await host.request("renewals", {"leases": [first, second]}))["leases"]
    assert [o["cancel_requested"] for o in outcomes] == [True, False]


async def test_another_hosts_lease_is_refused_and_not_extended(
    scheduler: Scheduler, nc: NatsClient, subject_prefix: str, make_host: Callable[..., TestHost]
) -> None:
    owner, other = make_host("owner"), make_host("intruder")
    await owner.register("od1")
    await other.register("id1")
    (lease,) = (a.lease for a in await _running(owner, nc, subject_prefix, 1))
    before = (await get_task(nc, subject_prefix, str(lease["task_id"])))["attempts"][-1]["expires_at"]
    (outcome,) = (await other.request("renewals", {"leases": [lease]}))["leases"]
    assert outcome["error"]["code"] == "lease_foreign"
    after = (await get_task(nc, subject_prefix, str(lease["task_id"])))["attempts"][-1]["expires_at"]
    assert after == before


@pytest.mark.parametrize(
    ("body", "path"),
    [
        ({"leases": []}, "leases"),
        ({}, "leases"),
        ({"leases": [{"task_id": "not-a-uuid", "attempt": 1, "lease_id": "x"}]}, "leases.0.task_id"),
    ],
)
async def test_a_bad_list_is_refused_whole(
    scheduler: Scheduler, make_host: Callable[..., TestHost], body: dict[str, object], path: str
) -> None:
    host = make_host()
    await host.register("d1")
    with pytest.raises(ErrorReply) as caught:
        await host.request("renewals", body)
    assert caught.value.code == "invalid_request"
    assert path in [e["path"] for e in caught.value.details["errors"]]


async def test_a_lease_named_twice_is_refused_whole(
    scheduler: Scheduler, nc: NatsClient, subject_prefix: str, make_host: Callable[..., TestHost]
) -> None:
    host = make_host()
    await host.register("d1")
    (lease,) = (a.lease for a in await _running(host, nc, subject_prefix, 1))
    before = (await get_task(nc, subject_prefix, str(lease["task_id"])))["attempts"][-1]["expires_at"]
    with pytest.raises(ErrorReply) as caught:
        await host.request("renewals", {"leases": [lease, lease]})
    assert caught.value.code == "invalid_request"
    assert (await get_task(nc, subject_prefix, str(lease["task_id"])))["attempts"][-1]["expires_at"] == before
