"""The claim's optional `progress` over NATS: advertised in the register and heartbeat replies, accepted on a
claim (dispatched, then progress), validated as a renewal's, and a claim without it works as before."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
from nats.aio.client import Client as NatsClient

from devsched.scheduler.app import Scheduler
from support.polling import eventually
from support.scheduler_harness import (
    ErrorReply,
    TestHost,
    check,
    done_result,
    get_task,
    plan,
    progress_of,
    raw_request,
    submit,
    task_events,
)

pytestmark = pytest.mark.integration


async def _relayed(host: TestHost, prefix: str, task_id: str, count: int) -> list[dict[str, object]]:
    async def enough() -> list[dict[str, object]] | None:
        events = await task_events(host.js, prefix, task_id)
        return events if len(events) >= count else None

    found = await eventually(enough, message=f"{count} events of {task_id} relayed")
    assert isinstance(found, list)
    return found


async def test_register_and_heartbeat_say_a_claim_may_carry_progress(
    scheduler: Scheduler, make_host: Callable[..., TestHost]
) -> None:
    host = make_host()
    assert (await host.register("d1"))["claim_progress"] is True
    assert (await host.request("heartbeat", {}))["claim_progress"] is True


async def test_a_claim_with_progress_dispatches_and_records_the_first_step(
    scheduler: Scheduler, nc: NatsClient, subject_prefix: str, make_host: Callable[..., TestHost]
) -> None:
    host = make_host()
    await host.register("d1")
    body = plan("flash", "test")
    task_id = await submit(nc, subject_prefix, plan=body)
    a = await host.next_assignment()
    claimed = await host.request("claim", {**a.lease, "progress": progress_of(body, 0)})
    assert claimed["cancel_requested"] is False
    view = await get_task(nc, subject_prefix, task_id)
    assert view["status"] == "dispatched"
    assert view["attempts"][0]["progress"] == {"step": "flash", "index": 0, "of": 2}
    assert view["attempts"][0]["expires_at"] == claimed["expires_at"]

    again = await host.request("claim", {**a.lease, "progress": progress_of(body, 0)})  # a lost reply's retry
    assert again["expires_at"] >= claimed["expires_at"]
    await host.renew(a, progress_of(body, 1))
    await host.report(a, "done", result=done_result(body))
    events = await _relayed(host, subject_prefix, task_id, 6)
    assert [(e["event"], e["seq"]) for e in events] == [
        ("submitted", 1),
        ("assigned", 2),
        ("dispatched", 3),
        ("progress", 4),
        ("progress", 5),
        ("done", 6),
    ]
    assert events[3]["progress"] == {"step": "flash", "index": 0, "of": 2}
    assert events[3]["status"] == "dispatched"


async def test_a_claim_without_progress_still_works(
    scheduler: Scheduler, nc: NatsClient, subject_prefix: str, make_host: Callable[..., TestHost]
) -> None:
    host = make_host()
    await host.register("d1")
    task_id = await submit(nc, subject_prefix, plan=plan("flash"))
    a = await host.next_assignment()
    assert set(a.lease) == {"task_id", "attempt", "lease_id"}  # the claim of an older agent
    await host.claim(a)
    view = await get_task(nc, subject_prefix, task_id)
    assert (view["status"], view["attempts"][0]["progress"]) == ("dispatched", None)
    events = await _relayed(host, subject_prefix, task_id, 3)
    assert [e["event"] for e in events] == ["submitted", "assigned", "dispatched"]


async def test_a_claim_with_bad_progress_is_refused_as_a_renewal_would_be(
    scheduler: Scheduler, nc: NatsClient, subject_prefix: str, make_host: Callable[..., TestHost]
) -> None:
    host = make_host()
    await host.register("d1")
    task_id = await submit(nc, subject_prefix, plan=plan("flash"))
    a = await host.next_assignment()
    bad = {"step": "flash", "index": 1, "of": 1}
    for verb in ("renew", "claim"):
        msg = await raw_request(nc, host.subject(verb), json.dumps({**a.lease, "progress": bad}).encode())
        with pytest.raises(ErrorReply) as caught:
            check(msg)
        assert (caught.value.status, caught.value.code) == (400, "invalid_request"), verb
        assert [e["path"] for e in caught.value.details["errors"]] == ["progress"], verb
    assert (await get_task(nc, subject_prefix, task_id))["status"] == "assigned"
