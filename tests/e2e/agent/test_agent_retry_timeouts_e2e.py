"""Retry policies and time limits (issue 13) with the real agent, scheduler and sweeper.

An infrastructure failure (a step marked `infra`) is retried after its backoff on another device, while a
failed test step ends the task; each time limit ends a task with its reason: `queue_timeout` (no device in
time), `attempt_timeout` (the agent stops the attempt as for a cancellation, teardown included; or the
sweeper, when a step does not let the agent stop), `deadline_exceeded`.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from support.agent_e2e import AgentLab, at, shell, touch

pytestmark = pytest.mark.e2e

TERMINAL = ("done", "failed", "cancelled")


def _fails_once(lab: AgentLab, name: str) -> str:
    """A command that fails the first time it runs (on whichever device), and succeeds after."""
    marker = lab.path(f"ran-{name}")
    return f"if [ -e '{marker}' ]; then exit 0; fi; touch '{marker}'; exit 3"


async def test_an_infra_failure_is_retried_with_backoff_on_another_device_while_a_failed_test_is_not(
    lab: AgentLab,
) -> None:
    await lab.agent("d1", "d2").ready()
    retry = {"on": ["infra"], "backoff": {"initial_s": 2, "max_s": 2}}
    flaky_flash = [shell("flash", _fails_once(lab, "flash"), infra=True), shell("test", "true")]
    infra = await lab.submit(flaky_flash, retry=retry)
    waiting = await lab.wait_view(
        infra, lambda v: (v["pending_reason"] or "").startswith("retry_backoff:"), what="in its backoff"
    )
    assert waiting["status"] == "queued"
    assert "not_before" in waiting
    view = await lab.wait_status(infra, *TERMINAL, within=30)
    assert (view["status"], view["attempt_count"]) == ("done", 2), view
    first, second = view["attempts"]
    assert (first["status"], second["status"]) == ("failed", "done")
    assert second["device_id"] != first["device_id"], "the retry ran on the other device"
    assert at(second["assigned_at"]) - at(first["ended_at"]) >= timedelta(seconds=2), "it waited its backoff"
    requeued = [e for e in await lab.events(infra) if e["event"] == "requeued"]
    assert [(e["reason"], e["attempt"]) for e in requeued] == [("infra", 1)]

    failing_test = [shell("flash", "true", infra=True), shell("test", "exit 1")]
    tested = await lab.submit(failing_test, retry=retry)
    view = await lab.wait_status(tested, *TERMINAL, within=30)
    assert (view["status"], view["attempt_count"]) == ("failed", 1), view
    assert view["reason"].startswith("step 'test' failed")


async def test_a_queue_timeout_fails_a_task_no_device_takes(lab: AgentLab) -> None:
    task_id = await lab.submit([shell("work", "true")], queue_timeout_s=1.0)  # this lab has no agent
    view = await lab.wait_status(task_id, *TERMINAL, within=20)
    assert (view["status"], view["reason"], view["attempts"]) == ("failed", "queue_timeout", [])
    events = await lab.wait_events(task_id, "failed")
    (failed,) = [e for e in events if e["event"] == "failed"]
    assert failed["reason"] == "queue_timeout"


async def test_the_agent_stops_an_attempt_past_its_timeout_with_teardown(lab: AgentLab) -> None:
    await lab.agent("d1").ready()
    steps: list[dict[str, Any]] = [shell(f"step-{i}", "sleep 0.7") for i in range(8)]
    steps.append(shell("teardown", touch(lab.path("teardown")), always=True))
    task_id = await lab.submit(steps, attempt_timeout_s=1.5, max_attempts=1)
    view = await lab.wait_status(task_id, *TERMINAL, within=30)
    assert (view["status"], view["reason"]) == ("failed", "attempt_timeout"), view
    (attempt,) = view["attempts"]
    assert (attempt["status"], attempt["report_reason"]) == ("failed", "attempt_timeout")
    statuses = [s["status"] for s in attempt["result"]["steps"]]
    assert (statuses[0], statuses[-1]) == ("done", "done"), statuses  # the last is the teardown
    assert "skipped" in statuses
    assert lab.path("teardown").exists()


async def test_the_sweeper_ends_an_attempt_whose_step_does_not_let_the_agent_stop(lab: AgentLab) -> None:
    await lab.agent("d1").ready()
    # one step, not interruptible, longer than the timeout and a lease ttl: only the sweeper can end it
    task_id = await lab.submit([shell("stuck", "sleep 8")], attempt_timeout_s=1.0, lease_ttl_s=2, max_attempts=1)
    view = await lab.wait_status(task_id, *TERMINAL, within=20)
    assert (view["status"], view["reason"]) == ("failed", "attempt_timeout"), view
    (attempt,) = view["attempts"]
    assert (attempt["status"], attempt["end_reason"]) == ("expired", "attempt_timeout")


async def test_a_deadline_ends_a_running_task_with_deadline_exceeded(lab: AgentLab) -> None:
    await lab.agent("d1").ready()
    deadline = (datetime.now(UTC) + timedelta(seconds=2)).isoformat().replace("+00:00", "Z")
    steps = [shell(f"step-{i}", "sleep 0.5") for i in range(20)]
    task_id = await lab.submit(steps, deadline=deadline, max_attempts=3)
    view = await lab.wait_status(task_id, *TERMINAL, within=30)
    assert (view["status"], view["reason"], view["attempt_count"]) == ("failed", "deadline_exceeded", 1), view
    assert at(view["deadline"]) == at(deadline)
