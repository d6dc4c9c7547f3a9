"""Health checks over NATS (issue 13 item 2): `P.api.health.set|list|delete`, and the scheduler's pass.

Raw JSON against a real scheduler, Postgres and nats-server; a protocol-level host runs the health task.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from nats.aio.client import Client as NatsClient

from devsched.scheduler.app import Scheduler
from support.scheduler_harness import (
    ErrorReply,
    TestHost,
    api,
    call,
    check,
    delete_streams,
    plan,
    raw_request,
    running_scheduler,
    scheduler_settings,
)

pytestmark = pytest.mark.integration


async def _error(nc: NatsClient, subject: str, body: dict[str, Any]) -> ErrorReply:
    with pytest.raises(ErrorReply) as caught:
        check(await raw_request(nc, subject, json.dumps(body).encode()))
    return caught.value


async def test_set_list_and_delete(scheduler: Scheduler, nc: NatsClient, subject_prefix: str) -> None:
    p = subject_prefix
    body = {"name": "adb", "selector": {"labels": {"platform": "android"}}, "plan": plan("adb-alive")}
    view = await call(nc, api(p, "health.set"), body)
    assert (view["name"], view["selector"], view["interval_s"]) == ("adb", {"labels": {"platform": "android"}}, 86400)
    assert view["plan"]["steps"][0]["name"] == "adb-alive"
    assert view["created_at"].endswith("Z")
    await call(nc, api(p, "health.set"), {"name": "any", "plan": plan(), "interval_s": 60})
    replaced = await call(nc, api(p, "health.set"), {**body, "interval_s": 3600.5})
    assert (replaced["interval_s"], replaced["created_at"]) == (3600.5, view["created_at"])
    listed = await call(nc, api(p, "health.list"), {})
    assert [c["name"] for c in listed["checks"]] == ["adb", "any"]
    assert (await call(nc, api(p, "health.delete"), {"name": "adb"}))["name"] == "adb"
    assert [c["name"] for c in (await call(nc, api(p, "health.list")))["checks"]] == ["any"]
    err = await _error(nc, api(p, "health.delete"), {"name": "adb"})
    assert (err.status, err.code) == (404, "not_found")


@pytest.mark.parametrize(
    ("body", "path"),
    [
        ({"name": "adb"}, "plan"),
        ({"name": "a.b", "plan": plan()}, "name"),
        ({"name": "adb", "plan": plan(), "interval_s": 0}, "interval_s"),
        ({"name": "adb", "plan": {"steps": []}}, "plan.steps"),
        ({"name": "adb", "plan": plan(), "selector": {"labels": {"devsched.action.x": "1"}}}, "selector.labels"),
        ({"name": "adb", "plan": plan(), "selector": {"device_id": "d1"}}, "selector.device_id"),
    ],
)
async def test_set_refuses_what_is_not_a_check(
    scheduler: Scheduler, nc: NatsClient, subject_prefix: str, body: dict[str, Any], path: str
) -> None:
    err = await _error(nc, api(subject_prefix, "health.set"), body)
    assert (err.status, err.code) == (400, "invalid_request")
    assert path in [e["path"] for e in err.details["errors"]]
    assert (await call(nc, api(subject_prefix, "health.list")))["checks"] == []


@pytest.fixture
async def health_scheduler(
    database_url: str, nats_url: str, subject_prefix: str, nc: NatsClient
) -> AsyncIterator[Scheduler]:
    """A scheduler whose health pass runs every 0.2 s."""
    settings = scheduler_settings(database_url, nats_url, subject_prefix, health_pass_interval_s=0.2)
    async with running_scheduler(settings) as running:
        yield running
    await delete_streams(nc, subject_prefix)


async def test_the_pass_runs_a_check_before_a_new_devices_first_task(
    health_scheduler: Scheduler, nc: NatsClient, subject_prefix: str, make_host: Callable[..., TestHost]
) -> None:
    p = subject_prefix
    await call(nc, api(p, "health.set"), {"name": "adb", "plan": plan("adb-alive"), "interval_s": 3600})
    host = make_host()
    await host.register(("d1", {"platform": "android"}))
    health = await host.next_assignment()
    assert [s["name"] for s in health.body["plan"]["steps"]] == ["adb-alive"]
    view = await call(nc, api(p, "tasks.get"), {"task_id": health.task_id})
    assert (view["kind"], view["health_device_id"], view["name"]) == ("health", "d1", "health:adb")
    user = await call(nc, api(p, "tasks.submit"), {"plan": plan()})
    await host.claim(health)
    await host.report(health)
    assigned = await host.next_assignment()
    assert assigned.task_id == user["task_id"]
    listed = await call(nc, api(p, "tasks.list"), {"kind": "health"})
    assert [t["task_id"] for t in listed["tasks"]] == [health.task_id]
    users = await call(nc, api(p, "tasks.list"), {"kind": "user"})
    assert [t["task_id"] for t in users["tasks"]] == [user["task_id"]]
    assert "health_device_id" not in users["tasks"][0]  # left out of a user task's view
    assert users["tasks"][0]["kind"] == "user"
