"""The real agent claims with the first step's progress against the real scheduler: a one-step task costs a
claim and a report (no renewal), the task still shows its progress and its events, and a cancellation
pending at claim time still stops the run before its first step."""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator

import pytest

from support.agent_e2e import AgentLab, AgentProcess, noop, shell, step_statuses, touch
from support.host_requests import HostRequests, listening
from support.polling import eventually

pytestmark = pytest.mark.e2e

TTL_S = 30  # long enough that no renewal falls due on the lease clock while a task runs


@pytest.fixture
async def agent(lab: AgentLab) -> AgentProcess:
    return await lab.agent("d1").ready()


@pytest.fixture
async def requests(lab: AgentLab, agent: AgentProcess) -> AsyncIterator[HostRequests]:
    async with listening(lab.nc, lab.prefix, agent.host_id) as heard:
        yield heard


async def test_a_one_step_task_is_a_claim_and_a_report(lab: AgentLab, requests: HostRequests) -> None:
    task_id = await lab.submit([noop("only")], lease_ttl_s=TTL_S)
    view = await lab.wait_status(task_id, "done")
    await eventually(lambda: requests.of(task_id)["report"] >= 1, message="the report heard")
    assert requests.of(task_id) == Counter({"claim": 1, "report": 1}), "no renewal: the claim carried the step"
    (claim,) = [body for verb, body in requests.heard if verb == "claim" and body.get("task_id") == task_id]
    assert claim["progress"] == {"step": "only", "index": 0, "of": 1}
    assert view["attempts"][0]["progress"] == {"step": "only", "index": 0, "of": 1}
    events = await lab.wait_events(task_id, "done")
    assert [(e["event"], e["seq"]) for e in events] == [
        ("submitted", 1),
        ("assigned", 2),
        ("dispatched", 3),
        ("progress", 4),
        ("done", 5),
    ]
    assert events[3]["progress"] == {"step": "only", "index": 0, "of": 1}


async def test_later_steps_renew_at_their_boundaries(lab: AgentLab, requests: HostRequests) -> None:
    task_id = await lab.submit([noop("flash"), noop("test")], lease_ttl_s=TTL_S)
    view = await lab.wait_status(task_id, "done")
    await eventually(lambda: requests.of(task_id)["report"] >= 1, message="the report heard")
    assert requests.of(task_id) == Counter({"claim": 1, "renew": 1, "report": 1})
    assert view["attempts"][0]["progress"] == {"step": "test", "index": 1, "of": 2}
    events = await lab.wait_events(task_id, "done")
    assert [e["event"] for e in events] == ["submitted", "assigned", "dispatched", "progress", "progress", "done"]
    assert [e["seq"] for e in events] == [1, 2, 3, 4, 5, 6]


async def test_a_cancellation_pending_at_claim_time_stops_before_the_first_step(
    lab: AgentLab, agent: AgentProcess
) -> None:
    ran = lab.path("ran")
    with agent.process.paused():  # the agent claims only after the cancellation is recorded
        task_id = await lab.submit([shell("work", touch(ran))], lease_ttl_s=TTL_S)
        await lab.wait_status(task_id, "assigned", within=10)
        assert (await lab.cancel(task_id))["cancel_requested"] is True
    view = await lab.wait_status(task_id, "cancelled")
    assert step_statuses(view) == [("work", "skipped")]
    assert view["result"]["steps"][0]["output_tail"] == "skipped: cancelled"
    assert view["attempts"][0]["end_reason"] == "cancelled"
    # the step's boundary did not renew (the claim carried its progress): only the claim's reply can
    # have stopped it, as the runner looks at the stop before the lease keeper runs at all
    assert not ran.exists()
