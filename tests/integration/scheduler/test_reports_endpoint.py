"""`P.host.<id>.reports` over NATS: advertised in the register and heartbeat replies, each report answered in
the request's order with what `report` would answer it (its reply, a hand-over with `take_next`, or its
error, which fails only its own entry), a repeat answered as duplicates, each entry counted as a `report`,
and bad lists refused whole with nothing changed."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pytest
from nats.aio.client import Client as NatsClient

from devsched.core.limits import MAX_REPORTS_PER_REQUEST
from devsched.scheduler.app import Scheduler
from devsched.scheduler.metrics import REGISTRY
from support.scheduler_harness import Assigned, ErrorReply, TestHost, done_result, get_task, plan, submit

pytestmark = pytest.mark.integration

PLAN = plan("flash")


async def _running(host: TestHost, nc: NatsClient, prefix: str, count: int) -> list[Assigned]:
    running = []
    for _ in range(count):
        await submit(nc, prefix, plan=PLAN)
        a = await host.next_assignment()
        await host.claim(a)
        running.append(a)
    return running


def _report(a: Assigned, outcome: str = "done", **fields: Any) -> dict[str, Any]:
    return {**a.lease, "outcome": outcome, "result": done_result(PLAN), **fields}


def _reports_counted(code: str) -> float:
    return REGISTRY.get_sample_value("devsched_reports_total", {"code": code}) or 0.0


async def _status(nc: NatsClient, prefix: str, a: Assigned) -> str:
    return str((await get_task(nc, prefix, a.task_id))["status"])


async def test_register_and_heartbeat_say_reports_are_served(
    scheduler: Scheduler, make_host: Callable[..., TestHost]
) -> None:
    host = make_host()
    assert (await host.register("d1"))["reports"] is True
    assert (await host.request("heartbeat", {}))["reports"] is True


async def test_each_report_is_answered_in_order_and_a_refused_one_fails_alone(
    scheduler: Scheduler, nc: NatsClient, subject_prefix: str, make_host: Callable[..., TestHost]
) -> None:
    host = make_host()
    await host.register("d1", "d2", "d3")
    first, second, third = await _running(host, nc, subject_prefix, 3)
    stale = {**_report(second), "lease_id": str(uuid.uuid4())}  # a lease the attempt no longer holds
    ok, superseded = _reports_counted("ok"), _reports_counted("lease_superseded")
    reply = await host.request("reports", {"reports": [_report(third, "failed", reason="boom"), stale, _report(first)]})
    outcomes = reply["reports"]
    assert [(o["task_id"], o["lease_id"]) for o in outcomes] == [
        (third.task_id, third.lease["lease_id"]),
        (second.task_id, stale["lease_id"]),
        (first.task_id, first.lease["lease_id"]),
    ]
    assert "error" not in outcomes[0]
    assert outcomes[0]["duplicate"] is False
    assert outcomes[1]["error"]["code"] == "lease_superseded"
    assert "status" not in outcomes[1]
    assert "recorded_at" not in outcomes[1]
    assert outcomes[2]["status"] == "done"
    assert await _status(nc, subject_prefix, first) == "done"
    assert await _status(nc, subject_prefix, second) == "dispatched", "the refused report changed nothing"
    assert outcomes[0]["status"] == await _status(nc, subject_prefix, third)  # failed, or queued for a retry
    assert _reports_counted("ok") == ok + 2, "each report counts as its `report` would"
    assert _reports_counted("lease_superseded") == superseded + 1

    again = await host.request("reports", {"reports": [_report(first), _report(second)]})
    first_again, second_now = again["reports"]
    assert first_again["duplicate"] is True
    assert first_again["recorded_at"] == outcomes[2]["recorded_at"]
    assert (second_now["status"], second_now["duplicate"]) == ("done", False)


async def test_another_hosts_lease_fails_only_its_own_entry(
    scheduler: Scheduler, nc: NatsClient, subject_prefix: str, make_host: Callable[..., TestHost]
) -> None:
    owner, other = make_host("owner"), make_host("intruder")
    await owner.register("od1")
    await other.register("id1")
    (theirs,) = await _running(owner, nc, subject_prefix, 1)
    (mine,) = await _running(other, nc, subject_prefix, 1)
    foreign, own = (await other.request("reports", {"reports": [_report(theirs), _report(mine)]}))["reports"]
    assert foreign["error"]["code"] == "lease_foreign"
    assert own["status"] == "done"
    assert await _status(nc, subject_prefix, theirs) == "dispatched"
    assert await _status(nc, subject_prefix, mine) == "done"


async def test_each_report_taking_next_gets_its_own_devices_next_attempt(
    scheduler: Scheduler, nc: NatsClient, subject_prefix: str, make_host: Callable[..., TestHost]
) -> None:
    host = make_host()
    await host.register("d1", "d2")
    running = await _running(host, nc, subject_prefix, 2)
    queued = {await submit(nc, subject_prefix, plan=PLAN) for _ in range(2)}  # both devices busy: they wait
    body = {"reports": [_report(a, take_next=True) for a in running]}
    outcomes = (await host.request("reports", body))["reports"]
    handed = [o["next"] for o in outcomes]
    assert [h["device_id"] for h in handed] == [a.body["device_id"] for a in running]
    assert {h["task_id"] for h in handed} == queued
    for h in handed:
        view = await get_task(nc, subject_prefix, h["task_id"])
        assert (view["status"], view["attempts"][0]["lease_id"]) == ("dispatched", h["lease_id"])

    repeat = (await host.request("reports", body))["reports"]  # the first reply was lost: sent again
    assert [o["duplicate"] for o in repeat] == [True, True]
    assert [o["next"]["lease_id"] for o in repeat] == [h["lease_id"] for h in handed]
    assert await host.no_assignment(0.5), "nothing comes through JetStream for attempts handed over"


@pytest.mark.parametrize(
    ("entries", "path"),
    [
        ("empty", "reports"),
        ("missing", "reports"),
        ("too_many", "reports"),
        ("twice", "reports"),
        ("one_bad", "reports.1.outcome"),
    ],
)
async def test_a_bad_list_is_refused_whole_and_changes_nothing(
    scheduler: Scheduler,
    nc: NatsClient,
    subject_prefix: str,
    make_host: Callable[..., TestHost],
    entries: str,
    path: str,
) -> None:
    host = make_host()
    await host.register("d1")
    (a,) = await _running(host, nc, subject_prefix, 1)
    good = _report(a)
    body: dict[str, Any] = {
        "empty": {"reports": []},
        "missing": {},
        "too_many": {"reports": [good] + [_report(a, attempt=n) for n in range(2, MAX_REPORTS_PER_REQUEST + 2)]},
        "twice": {"reports": [good, good]},
        "one_bad": {"reports": [good, {**_report(a, attempt=2), "outcome": "exploded"}]},
    }[entries]
    with pytest.raises(ErrorReply) as caught:
        await host.request("reports", body)
    assert (caught.value.status, caught.value.code) == (400, "invalid_request")
    assert path in [e["path"] for e in caught.value.details["errors"]]
    assert await _status(nc, subject_prefix, a) == "dispatched"
