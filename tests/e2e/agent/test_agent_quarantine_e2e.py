"""Device quarantine (issue 13 item 1) with the real agent, scheduler and sweeper.

A device whose `infra` step fails three times in a row (a retry policy on `infra`, three attempts) is
quarantined: the hosts view shows it, with its reason, and it takes no work; `devsched drain --undo`
returns it to service and the waiting task runs.
"""

from __future__ import annotations

from typing import Any

import pytest

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
    retry = {"on": ["infra"], "backoff": {"initial_s": 0.2, "max_s": 0.2}}
    broken = [shell("flash", "exit 3", infra=True), shell("test", "true")]
    task_id = await lab.submit(broken, retry=retry, max_attempts=3)
    view = await lab.wait_status(task_id, *TERMINAL, within=40)
    assert (view["status"], view["attempt_count"]) == ("failed", 3), view

    device = await _device(lab, "d1")
    assert (device["state"], device["quarantined"], device["infra_failures"]) == ("quarantined", True, 3), device
    assert device["quarantine_reason"] == "3 consecutive infrastructure failures (last: infra)"
    assert "quarantined_since" in device

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
