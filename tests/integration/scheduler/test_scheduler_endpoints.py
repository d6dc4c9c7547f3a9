"""Every endpoint of PROTOCOL.md section 1 and every error code, over NATS with raw JSON."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from nats.aio.client import Client as NatsClient

from devsched.protocol.endpoints import ENDPOINTS
from devsched.protocol.subjects import Subjects
from devsched.scheduler.app import Scheduler
from support.scheduler_harness import ErrorReply, TestHost, api, call, check, get_task, plan, raw_request, submit

pytestmark = pytest.mark.integration


async def error_of(nc: NatsClient, subject: str, data: bytes | dict[str, Any]) -> ErrorReply:
    raw = json.dumps(data).encode() if isinstance(data, dict) else data
    msg = await raw_request(nc, subject, raw)
    with pytest.raises(ErrorReply) as caught:
        check(msg)
    err = caught.value
    assert err.headers["Nats-Service-Error-Code"] == str(err.status)
    assert err.headers["Nats-Service-Error"]
    return err


def paths(err: ErrorReply) -> list[str]:
    return [e["path"] for e in err.details["errors"]]


# -- discovery -----------------------------------------------------------------------------------------


async def test_service_is_discoverable_with_every_endpoint_in_one_queue_group(
    scheduler: Scheduler, nc: NatsClient, subject_prefix: str
) -> None:
    name = f"{subject_prefix}-scheduler"
    ping = json.loads((await nc.request(f"$SRV.PING.{name}", b"", timeout=2)).data)
    assert ping["name"] == name
    info = json.loads((await nc.request(f"$SRV.INFO.{name}", b"", timeout=2)).data)
    subjects = {e["subject"] for e in info["endpoints"]}
    # every entry of the table, on the subject derived from it (test_wire_pinned.py holds them literally)
    assert subjects == {Subjects(subject_prefix).served(e) for e in ENDPOINTS}
    assert {e["queue_group"] for e in info["endpoints"]} == {name}
    await call(nc, api(subject_prefix, "hosts.list"))
    stats = json.loads((await nc.request(f"$SRV.STATS.{name}", b"", timeout=2)).data)
    hosts_list = next(e for e in stats["endpoints"] if e["name"] == "hosts-list")
    assert hosts_list["num_requests"] >= 1


async def test_service_info_carries_each_endpoints_request_and_reply_schema(
    scheduler: Scheduler, nc: NatsClient, subject_prefix: str
) -> None:
    """`nats micro info` documents the API: every endpoint's metadata holds its two JSON Schemas."""
    info = json.loads((await nc.request(f"$SRV.INFO.{subject_prefix}-scheduler", b"", timeout=2)).data)
    schemas = {
        e["name"]: (json.loads(e["metadata"]["request_schema"]), json.loads(e["metadata"]["response_schema"]))
        for e in info["endpoints"]
    }
    assert len(schemas) == len(info["endpoints"])
    submit_request, submit_reply = schemas["tasks-submit"]
    assert submit_request["title"] == "SubmitRequest"
    assert "plan" in submit_request["required"]
    assert submit_reply["title"] == "SubmitReply"
    assert schemas["host-renew"][0]["title"] == "RenewRequest"
    # The reply schema describes what the endpoint really sends: the same top-level fields.
    reply = await call(nc, api(subject_prefix, "hosts.list"))
    assert set(schemas["hosts-list"][1]["properties"]) == set(reply)


# -- operator endpoints -----------------------------------------------------------------------------


async def test_submit_applies_defaults_and_idempotency_key(
    scheduler: Scheduler, nc: NatsClient, subject_prefix: str
) -> None:
    first = await call(nc, api(subject_prefix, "tasks.submit"), {"plan": plan(), "idempotency_key": "ci-1"})
    again = await call(nc, api(subject_prefix, "tasks.submit"), {"plan": plan("other"), "idempotency_key": "ci-1"})
    assert first["created"] is True
    assert again == {**first, "created": False}
    view = await get_task(nc, subject_prefix, first["task_id"])
    assert (view["priority"], view["max_attempts"], view["lease_ttl_s"]) == (0, 3, 30)
    assert view["selector"] == {"labels": {}, "device_id": None}
    assert view["plan"]["steps"][0] == {
        "name": "run",
        "action": "noop",
        "args": {},
        "timeout_s": 3600.0,
        "interruptible": False,
        "always": False,
    }
    assert view["attempts"] == []
    assert view["status"] == "queued"
    assert view["cancel_requested"] is False


async def test_list_pages_newest_first_and_filters_by_status(
    scheduler: Scheduler, nc: NatsClient, subject_prefix: str
) -> None:
    ids = [await submit(nc, subject_prefix, name=f"t{i}") for i in range(3)]
    await call(nc, api(subject_prefix, "tasks.cancel"), {"task_id": ids[0]})
    page = await call(nc, api(subject_prefix, "tasks.list"), {"limit": 2})
    assert [t["task_id"] for t in page["tasks"]] == [ids[2], ids[1]]
    assert page["next"]
    assert "attempts" not in page["tasks"][0]
    rest = await call(nc, api(subject_prefix, "tasks.list"), {"limit": 2, "after": page["next"]})
    assert [t["task_id"] for t in rest["tasks"]] == [ids[0]]
    assert rest["next"] is None
    cancelled = await call(nc, api(subject_prefix, "tasks.list"), {"status": "cancelled"})
    assert [t["task_id"] for t in cancelled["tasks"]] == [ids[0]]


async def test_list_filters_by_the_device_a_task_ran_on(
    scheduler: Scheduler, nc: NatsClient, subject_prefix: str, make_host: Callable[..., TestHost]
) -> None:
    host = make_host()
    await host.register("d1", "d2")
    ran = await submit(nc, subject_prefix, selector={"device_id": "d1"})
    a = await host.next_assignment()
    await host.claim(a)
    await host.report(a)
    queued = await submit(nc, subject_prefix, selector={"device_id": "d1", "labels": {"none": "x"}})
    listed = api(subject_prefix, "tasks.list")
    assert [t["task_id"] for t in (await call(nc, listed, {"device_id": "d1"}))["tasks"]] == [ran]
    assert (await call(nc, listed, {"device_id": "d2"}))["tasks"] == []
    assert (await call(nc, listed, {"device_id": "d1", "status": "queued"}))["tasks"] == []
    assert (await call(nc, listed, {"device_id": "d1", "kind": "health"}))["tasks"] == []
    assert [t["task_id"] for t in (await call(nc, listed, {}))["tasks"]] == [queued, ran]


async def test_list_filters_by_the_start_of_the_id(scheduler: Scheduler, nc: NatsClient, subject_prefix: str) -> None:
    ids = [await submit(nc, subject_prefix, name=f"t{i}") for i in range(3)]
    listed = api(subject_prefix, "tasks.list")
    for task_id in ids:
        for prefix in (task_id[:8], task_id[:9], task_id[:20], task_id):
            assert [t["task_id"] for t in (await call(nc, listed, {"id_prefix": prefix}))["tasks"]] == [task_id]
    unknown = next(p for p in (uuid.uuid4().hex[:8] for _ in range(9)) if not any(i.startswith(p) for i in ids))
    assert (await call(nc, listed, {"id_prefix": unknown}))["tasks"] == []


async def test_cancel_queued_terminal_and_repeated(scheduler: Scheduler, nc: NatsClient, subject_prefix: str) -> None:
    task_id = await submit(nc, subject_prefix)
    cancel = api(subject_prefix, "tasks.cancel")
    assert await call(nc, cancel, {"task_id": task_id, "reason": "no longer needed"}) == {
        "task_id": task_id,
        "status": "cancelled",
        "cancel_requested": False,
    }
    assert await call(nc, cancel, {"task_id": task_id}) == {
        "task_id": task_id,
        "status": "cancelled",
        "cancel_requested": False,
    }
    view = await get_task(nc, subject_prefix, task_id)
    assert view["reason"] == "cancelled_while_queued"


async def test_hosts_list_and_drain(
    scheduler: Scheduler, nc: NatsClient, subject_prefix: str, make_host: Callable[..., TestHost]
) -> None:
    host = make_host()
    await host.register(("d1", {"platform": "android"}), "d2")
    listed = await call(nc, api(subject_prefix, "hosts.list"), {})
    (entry,) = listed["hosts"]
    assert entry["host_id"] == host.host_id
    assert entry["online"] is True
    assert entry["last_seen_at"].endswith("Z")
    healthy = {
        "quarantined": False,
        "quarantine_reason": None,
        "quarantined_since": None,
        "infra_failures": 0,
        "operator_labels": {},
    }
    assert entry["devices"] == [
        {
            "device_id": "d1",
            "labels": {"platform": "android"},
            "state": "available",
            "drained": False,
            "drain_reason": None,
            **healthy,
        },
        {"device_id": "d2", "labels": {}, "state": "available", "drained": False, "drain_reason": None, **healthy},
    ]
    drained = await call(nc, api(subject_prefix, "devices.drain"), {"device_id": "d1", "reason": "flaky USB hub"})
    assert drained == {
        "device_id": "d1",
        "host_id": host.host_id,
        "labels": {"platform": "android"},
        "state": "drained",
        "drained": True,
        "drain_reason": "flaky USB hub",
        **healthy,
    }
    task_id = await submit(nc, subject_prefix, selector={"device_id": "d1"})
    assert await host.no_assignment(0.5)
    await call(nc, api(subject_prefix, "devices.drain"), {"device_id": "d1", "drained": False})
    assert (await host.next_assignment()).task_id == task_id
    err = await error_of(nc, api(subject_prefix, "devices.drain"), {"device_id": "nope"})
    assert (err.status, err.code) == (404, "not_found")


async def test_heartbeat_and_reregistration(
    scheduler: Scheduler, nc: NatsClient, subject_prefix: str, make_host: Callable[..., TestHost]
) -> None:
    host = make_host()
    await host.register("d1")
    assert await host.request("heartbeat", {}) == {
        "heartbeat_interval_s": 5.0,
        "claim_progress": True,
        "take_next": True,
        "renewals": True,
        "reports": True,
    }
    await host.register("d2")  # replaces the list
    listed = await call(nc, api(subject_prefix, "hosts.list"), {})
    assert [d["device_id"] for d in listed["hosts"][0]["devices"]] == ["d2"]


# -- errors: the request itself ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "path"),
    [
        pytest.param(b"{", "", id="bad-json"),
        pytest.param(b"[1, 2]", "", id="not-an-object"),
        pytest.param(b'"text"', "", id="string"),
        pytest.param(b'{"plan": {"steps": [{"name": "a", "action": "noop"}]}, "priority": NaN}', "", id="nan"),
        pytest.param(b'{"plan": {"steps": []}, "plan": {"steps": []}}', "", id="duplicate-key"),
        pytest.param(b"\xff\xfe", "", id="not-utf8"),
        pytest.param(b"{}", "plan", id="missing-plan"),
        pytest.param(
            b'{"plan": {"steps": [{"name": "a", "action": "noop"}]}, "bogus": 1}', "bogus", id="unknown-field"
        ),
        pytest.param(
            b'{"plan": {"steps": [{"name": "a", "action": "noop"}]}, "priority": 5000}', "priority", id="range"
        ),
        pytest.param(
            b'{"plan": {"steps": [{"name": "a", "action": "noop"}]}, "lease_ttl_s": 0}', "lease_ttl_s", id="ttl"
        ),
        pytest.param(
            b'{"plan": {"steps": [{"name": "a", "action": "noop"}]}, "max_attempts": "3"}', "max_attempts", id="type"
        ),
        pytest.param(b'{"plan": {"steps": []}}', "plan.steps", id="no-steps"),
        pytest.param(b'{"plan": {"steps": [{"name": "a"}]}}', "plan.steps.0.action", id="missing-action"),
    ],
)
async def test_submit_rejects_invalid_requests_with_paths(
    scheduler: Scheduler, nc: NatsClient, subject_prefix: str, body: bytes, path: str
) -> None:
    err = await error_of(nc, api(subject_prefix, "tasks.submit"), body)
    assert (err.status, err.code) == (400, "invalid_request")
    assert path in paths(err)
    assert (await call(nc, api(subject_prefix, "tasks.list"), {}))["tasks"] == []  # nothing was created


@pytest.mark.parametrize(
    ("verb", "body", "path"),
    [
        ("tasks.get", {"task_id": "not-a-uuid"}, "task_id"),
        ("tasks.list", {"limit": 0}, "limit"),
        ("tasks.list", {"status": "sleeping"}, "status"),
        ("tasks.list", {"device_id": "a.b"}, "device_id"),  # issue 15: a token, like every device id
        ("tasks.list", {"device_id": ""}, "device_id"),
        ("tasks.list", {"device_id": 7}, "device_id"),
        ("tasks.list", {"id_prefix": "3af593"}, "id_prefix"),  # 8 hex digits at least
        ("tasks.list", {"id_prefix": "3AF5939C"}, "id_prefix"),  # as written: lowercase
        ("tasks.list", {"id_prefix": "3af5939c--"}, "id_prefix"),
        ("tasks.cancel", {}, "task_id"),
        ("hosts.list", {"x": 1}, "x"),
        ("devices.drain", {"device_id": "a.b"}, "device_id"),
        ("devices.forget", {"device_id": "d1"}, "reason"),
        ("devices.forget", {"device_id": "d1", "reason": ""}, "reason"),
        ("devices.label", {"device_id": "d1", "labels": {"devsched.action.flash": "1"}}, "labels"),
        ("devices.label", {"device_id": "d1", "labels": {"a": "1"}, "unset": ["a"]}, "unset"),
    ],
)
async def test_operator_endpoints_reject_invalid_requests(
    scheduler: Scheduler, nc: NatsClient, subject_prefix: str, verb: str, body: dict[str, Any], path: str
) -> None:
    err = await error_of(nc, api(subject_prefix, verb), body)
    assert (err.status, err.code, paths(err)) == (400, "invalid_request", [path])


async def test_host_endpoints_reject_invalid_requests(
    scheduler: Scheduler, nc: NatsClient, subject_prefix: str, make_host: Callable[..., TestHost]
) -> None:
    host = make_host()
    err = await error_of(nc, host.subject("register"), {"devices": [{"device_id": "d1"}, {"device_id": "d1"}]})
    assert (err.status, err.code, paths(err)) == (400, "invalid_request", ["devices"])
    await host.register("d1")
    lease = {"task_id": str(uuid.uuid4()), "attempt": 0, "lease_id": str(uuid.uuid4())}
    err = await error_of(nc, host.subject("claim"), lease)
    assert paths(err) == ["attempt"]
    err = await error_of(nc, host.subject("report"), {**lease, "attempt": 1, "outcome": "maybe"})
    assert paths(err) == ["outcome"]
    err = await error_of(
        nc, host.subject("renew"), {**lease, "attempt": 1, "progress": {"step": "a", "index": 3, "of": 2}}
    )
    assert paths(err) == ["progress"]
    err = await error_of(nc, f"{subject_prefix}.host.bad+id.heartbeat", {})
    assert (err.status, err.code) == (400, "invalid_request")


async def test_oversize_payload_is_413_on_every_endpoint(
    scheduler: Scheduler, nc: NatsClient, subject_prefix: str
) -> None:
    limit = scheduler.settings.max_payload_bytes
    big = json.dumps({"plan": plan(), "metadata": {"blob": "x" * limit}}).encode()
    for subject in (
        api(subject_prefix, "tasks.submit"),
        api(subject_prefix, "hosts.list"),
        f"{subject_prefix}.host.h1.renew",
    ):
        err = await error_of(nc, subject, big)
        assert (err.status, err.code) == (413, "too_large")
        assert err.details == {"size": len(big), "limit": limit}
    assert (await call(nc, api(subject_prefix, "tasks.list"), {}))["tasks"] == []


# -- errors: the state ---------------------------------------------------------------------------------


async def test_unknown_task_host_and_device_are_404(
    scheduler: Scheduler, nc: NatsClient, subject_prefix: str, make_host: Callable[..., TestHost]
) -> None:
    unknown = str(uuid.uuid4())
    for verb in ("tasks.get", "tasks.cancel"):
        err = await error_of(nc, api(subject_prefix, verb), {"task_id": unknown})
        assert (err.status, err.code) == (404, "not_found")
    stranger = make_host()
    lease = {"task_id": unknown, "attempt": 1, "lease_id": str(uuid.uuid4())}
    for verb, body in (("heartbeat", {}), ("claim", lease), ("renew", lease), ("report", {**lease, "outcome": "done"})):
        err = await error_of(nc, stranger.subject(verb), body)
        assert (err.status, err.code) == (404, "not_found"), verb
    await stranger.register("d1")
    err = await error_of(nc, stranger.subject("claim"), lease)
    assert (err.status, err.code) == (404, "not_found")


async def test_device_registered_by_another_host_is_409_device_conflict(
    scheduler: Scheduler, nc: NatsClient, make_host: Callable[..., TestHost], subject_prefix: str
) -> None:
    first, second = make_host(), make_host()
    await first.register("shared")
    err = await error_of(nc, second.subject("register"), {"devices": [{"device_id": "shared"}]})
    assert (err.status, err.code) == (409, "device_conflict")
    await first.register()  # withdrawn and idle: still the first host's
    err = await error_of(nc, second.subject("register"), {"devices": [{"device_id": "shared"}]})
    assert (err.status, err.code) == (409, "device_conflict")
    freed = await call(nc, api(subject_prefix, "devices.forget"), {"device_id": "shared", "reason": "moved"})
    assert (freed["device_id"], freed["host_id"], freed["reason"]) == ("shared", first.host_id, "moved")
    await second.register("shared")
    err = await error_of(nc, api(subject_prefix, "devices.forget"), {"device_id": "nope", "reason": "r"})
    assert (err.status, err.code) == (404, "not_found")


async def test_lease_conflicts_are_409_with_the_precise_code(
    scheduler: Scheduler, nc: NatsClient, subject_prefix: str, make_host: Callable[..., TestHost]
) -> None:
    owner, other = make_host(), make_host()
    await owner.register("d1")
    await other.register("d2")
    task_id = await submit(nc, subject_prefix, selector={"device_id": "d1"})
    a = await owner.next_assignment()
    await owner.claim(a)

    err = await error_of(nc, other.subject("renew"), a.lease)
    assert (err.status, err.code) == (409, "lease_foreign")
    err = await error_of(nc, owner.subject("renew"), {**a.lease, "lease_id": str(uuid.uuid4())})
    assert err.code == "lease_superseded"
    err = await error_of(nc, owner.subject("renew"), {**a.lease, "attempt": 2})
    assert err.code == "lease_superseded"
    err = await error_of(nc, owner.subject("report"), {**a.lease, "outcome": "cancelled"})
    assert err.code == "cancel_not_requested"

    await owner.report(a, "failed", reason="step flash exited 1")
    err = await error_of(nc, owner.subject("report"), {**a.lease, "outcome": "done"})
    assert err.code == "outcome_conflict"
    err = await error_of(nc, owner.subject("renew"), a.lease)
    assert err.code == "task_terminal"
    err = await error_of(nc, owner.subject("claim"), a.lease)
    assert err.code == "task_terminal"
    view = await get_task(nc, subject_prefix, task_id)
    assert view["status"] == "failed"
    assert view["reason"] == "step flash exited 1"


async def test_renewal_after_expiry_is_409_lease_expired(
    scheduler: Scheduler, nc: NatsClient, subject_prefix: str, make_host: Callable[..., TestHost]
) -> None:
    host = make_host()
    await host.register("d1")
    task_id = await submit(nc, subject_prefix, lease_ttl_s=1)
    a = await host.next_assignment()
    await host.claim(a)
    await asyncio.sleep(1.1)  # no sweeper runs here: the expiry alone must refuse the renewal
    err = await error_of(nc, host.subject("renew"), a.lease)
    assert (err.status, err.code) == (409, "lease_expired")
    err = await error_of(nc, host.subject("report"), {**a.lease, "outcome": "done"})
    assert err.code == "lease_expired"
    assert (await get_task(nc, subject_prefix, task_id))["status"] == "dispatched"
