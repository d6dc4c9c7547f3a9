"""The real agent takes each next task of its device from its report's reply against the real scheduler: the
tasks queued behind the first run without a claim and without an assignment message, each once, with the
events a claimed attempt has."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import AsyncIterator

import pytest
from nats.aio.msg import Msg

from support.agent_e2e import AgentLab, AgentProcess, noop
from support.host_requests import HostRequests, listening
from support.polling import eventually

pytestmark = pytest.mark.e2e

TTL_S = 30  # long enough that no renewal falls due on the lease clock while a task runs


class Assignments:
    """Every assignment message published for a host (`P.assign.<host_id>`), heard beside its consumer."""

    def __init__(self) -> None:
        self.tasks: list[str] = []

    async def hear(self, msg: Msg) -> None:
        self.tasks.append(str(json.loads(msg.data)["task_id"]))


@pytest.fixture
async def agent(lab: AgentLab) -> AgentProcess:
    return await lab.agent("d1").ready()


@pytest.fixture
async def requests(lab: AgentLab, agent: AgentProcess) -> AsyncIterator[HostRequests]:
    async with listening(lab.nc, lab.prefix, agent.host_id) as heard:
        yield heard


async def test_tasks_queued_for_a_device_run_from_the_report_replies(
    lab: AgentLab, agent: AgentProcess, requests: HostRequests
) -> None:
    published = Assignments()
    sub = await lab.nc.subscribe(f"{lab.prefix}.assign.{agent.host_id}", cb=published.hear)
    await lab.nc.flush()
    try:
        with agent.process.paused():  # the first is assigned by its submit, the others queue behind it
            first = await lab.submit([noop("only")], lease_ttl_s=TTL_S)
            await lab.wait_status(first, "assigned", within=10)
            queued = [await lab.submit([noop("flash"), noop("test")], lease_ttl_s=TTL_S) for _ in range(4)]
        for task_id in [first, *queued]:
            await lab.wait_status(task_id, "done")
        last = queued[-1]
        await eventually(lambda: requests.of(last)["report"] >= 1, message="the last report heard")
        assert requests.of(first) == Counter({"claim": 1, "report": 1})
        for task_id in queued:
            assert requests.of(task_id) == Counter({"renew": 1, "report": 1}), "no claim: handed over in a reply"
            events = await lab.wait_events(task_id, "done")
            assert [(e["event"], e["seq"]) for e in events] == [
                ("submitted", 1),
                ("assigned", 2),
                ("dispatched", 3),
                ("progress", 4),
                ("progress", 5),
                ("done", 6),
            ]
            assert events[3]["progress"] == {"step": "flash", "index": 0, "of": 2}
            view = await lab.task(task_id)
            assert len(view["attempts"]) == 1, "run once"
        reports = [body for verb, body in requests.heard if verb == "report"]
        assert all(body.get("take_next") is True for body in reports), "the device took work: every report asks"
        assert published.tasks == [first], "no assignment message for the tasks handed over"
    finally:
        await sub.unsubscribe()
