"""Device quarantine (issue 13 item 1) with the real agent, scheduler and sweeper.

A device whose `infra` step fails three times in a row (a retry policy on `infra`, three attempts) is
quarantined: the hosts view shows it, with its reason, a `device_quarantined` event is published on
`P.events.device.<device_id>`, and it takes no work; `devsched drain --undo` returns it to service (a
`device_returned` event) and the waiting task runs. A health check (item 2, `devsched health set`) runs on
the quarantined device as a `health` task: failing keeps it out, passing returns it.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from devsched.protocol.codec import decode
from devsched.protocol.messages import DeviceEventMessage
from devsched.protocol.subjects import Subjects
from support.agent_e2e import AgentLab, shell
from support.polling import eventually
from support.scheduler_harness import api, call

pytestmark = pytest.mark.e2e

TERMINAL = ("done", "failed", "cancelled")


async def _device(lab: AgentLab, name: str) -> dict[str, Any]:
    listed = await call(lab.nc, api(lab.prefix, "hosts.list"), {})
    device_id = lab.device(name)
    found: dict[str, Any] = next(d for h in listed["hosts"] for d in h["devices"] if d["device_id"] == device_id)
    return found


async def test_three_infra_failures_quarantine_the_device_and_drain_undo_returns_it(lab: AgentLab) -> None:
    await lab.agent("d1").ready()
    heard: list[DeviceEventMessage] = []

    async def on_event(msg: Any) -> None:
        heard.append(decode(DeviceEventMessage, msg.data))

    sub = await lab.nc.subscribe(Subjects(lab.prefix).device_events(lab.device("d1")), cb=on_event)

    async def heard_events(n: int) -> list[str] | None:
        return [e.event.value for e in heard] if len(heard) >= n else None

    retry = {"on": ["infra"], "backoff": {"initial_s": 0.2, "max_s": 0.2}}
    broken = [shell("flash", "exit 3", infra=True), shell("test", "true")]
    task_id = await lab.submit(broken, retry=retry, max_attempts=3)
    view = await lab.wait_status(task_id, *TERMINAL, within=40)
    assert (view["status"], view["attempt_count"]) == ("failed", 3), view

    device = await _device(lab, "d1")
    assert (device["state"], device["quarantined"], device["infra_failures"]) == ("quarantined", True, 3), device
    assert device["quarantine_reason"] == "3 consecutive infrastructure failures (last: infra)"
    assert "quarantined_since" in device
    assert await eventually(lambda: heard_events(1), timeout=10, message="device_quarantined heard") == [
        "device_quarantined"
    ]
    assert (heard[0].by, heard[0].infra_failures, heard[0].reason) == ("infra_failures", 3, device["quarantine_reason"])

    waiting = await lab.submit([shell("work", "true")])
    queued = await lab.task(waiting)
    assert (queued["status"], queued["attempts"]) == ("queued", []), "a quarantined device takes no work"

    shown = await lab.cli("hosts")
    assert shown.returncode == 0, shown.stderr
    assert "quarantined" in shown.stdout

    undone = await lab.cli("drain", lab.device("d1"), "--undo")
    assert undone.returncode == 0, undone.stderr
    view = await lab.wait_status(waiting, *TERMINAL, within=30)
    assert view["status"] == "done", view

    async def returned() -> dict[str, Any] | None:
        d = await _device(lab, "d1")
        return d if not d["quarantined"] else None

    device = await eventually(returned, timeout=10, message="d1 back in service")
    assert (device["state"], device["infra_failures"]) == ("available", 0), device
    events = await eventually(lambda: heard_events(2), timeout=10, message="device_returned heard")
    assert events == ["device_quarantined", "device_returned"]
    assert heard[1].by == "operator"
    await sub.unsubscribe()


async def _quarantined(lab: AgentLab) -> None:
    """Three infra failures in a row on d1, which quarantine it."""
    retry = {"on": ["infra"], "backoff": {"initial_s": 0.2, "max_s": 0.2}}
    task_id = await lab.submit([shell("flash", "exit 3", infra=True)], retry=retry, max_attempts=3)
    view = await lab.wait_status(task_id, *TERMINAL, within=40)
    assert (view["status"], view["attempt_count"]) == ("failed", 3), view
    assert (await _device(lab, "d1"))["quarantined"]


async def _health_tasks(lab: AgentLab) -> list[dict[str, Any]]:
    listed = await call(lab.nc, api(lab.prefix, "tasks.list"), {"kind": "health"})
    tasks: list[dict[str, Any]] = listed["tasks"]
    return tasks


async def test_a_failing_health_check_keeps_a_quarantined_device_out_and_a_passing_one_returns_it(
    lab: AgentLab,
) -> None:
    """Issue 13 item 2 with the real agent: the check runs on the quarantined device, as a task of its own kind."""
    await lab.agent("d1").ready()
    await _quarantined(lab)
    reason = (await _device(lab, "d1"))["quarantine_reason"]
    waiting = await lab.submit([shell("work", "true")])

    failing = lab.path("failing.yaml")
    failing.write_text(json.dumps({"steps": [shell("adb-alive", "exit 1")]}))
    made = await lab.cli("health", "set", "adb", str(failing), "--interval", "3600")
    assert made.returncode == 0, made.stderr

    async def ended_check() -> dict[str, Any] | None:
        return next((t for t in await _health_tasks(lab) if t["status"] in TERMINAL), None)

    first = await eventually(ended_check, timeout=30, message="the failing health check ran")
    assert (first["status"], first["name"], first["health_device_id"]) == ("failed", "health:adb", lab.device("d1"))
    device = await _device(lab, "d1")
    assert (device["state"], device["quarantine_reason"]) == ("quarantined", reason), device
    assert (await lab.task(waiting))["attempts"] == [], "user tasks still skip the device"

    passing = lab.path("passing.yaml")
    passing.write_text(json.dumps({"steps": [shell("adb-alive", "true")]}))
    made = await lab.cli("health", "set", "adb", str(passing), "--interval", "3600")
    assert made.returncode == 0, made.stderr
    view = await lab.wait_status(waiting, *TERMINAL, within=40)  # the device came back and took it
    assert view["status"] == "done", view
    checks = await _health_tasks(lab)
    assert sorted(t["status"] for t in checks) == ["done", "failed"], checks
    device = await _device(lab, "d1")
    assert (device["state"], device["quarantined"], device["infra_failures"]) == ("available", False, 0), device

    shown = await lab.cli("ls", "--kind", "health")
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.count("health:adb") == 2, shown.stdout
    listed = await lab.cli("health", "ls", "--json")
    assert [c["name"] for c in json.loads(listed.stdout)["checks"]] == ["adb"]
    removed = await lab.cli("health", "rm", "adb")
    assert removed.returncode == 0, removed.stderr
