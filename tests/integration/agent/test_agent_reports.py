"""The real agent sends the reports of attempts ending together in `reports` requests against the real
scheduler (processes, with the sweeper, NATS and Postgres): counted on the host's subjects beside the
scheduler. Each report is still answered on its own, hand-overs (`take_next`) included, so every task ends
done with fewer requests than reports; an agent told not to batch reports one request per report."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from nats.aio.client import Client as NatsClient

from support.agent_e2e import AgentLab, Plane, noop, shell
from support.host_requests import HostRequests, listening
from support.polling import eventually

pytestmark = pytest.mark.integration

DEVICES = [f"d{n}" for n in range(1, 9)]


@pytest.fixture
async def lab(agent_plane: Plane, nc: NatsClient, tmp_path: Path) -> AsyncIterator[AgentLab]:
    lab = AgentLab(nc, agent_plane, tmp_path)
    yield lab
    await asyncio.to_thread(lab.stop)


async def two_waves(lab: AgentLab, **config: object) -> tuple[list[str], HostRequests]:
    """Eight tasks held at a gate on eight devices, eight quick ones queued behind them; the gate opened,
    every task done. The tasks, and the host's requests meanwhile."""
    agent = await lab.agent(*DEVICES, **config).ready()
    gate = lab.gate("end")
    async with listening(lab.nc, lab.prefix, agent.host_id) as heard:
        held = [await lab.submit([shell("hold", gate.wait)]) for _ in DEVICES]
        for task_id in held:
            await lab.wait_status(task_id, "dispatched", within=30)
        queued = [await lab.submit([noop("quick")]) for _ in DEVICES]  # every device busy: they wait
        gate.open()  # the eight end together: their reports hand the queued ones over
        for task_id in held + queued:
            await lab.wait_status(task_id, "done", within=60)
        # the requests are heard on another connection than the scheduler's: the last may come after the commit
        await eventually(lambda: sum(reported(heard)[0]) + reported(heard)[1] >= len(held + queued), timeout=10)
    return held + queued, heard


def reported(heard: HostRequests) -> tuple[list[int], int]:
    """The sizes of the `reports` requests heard, and how many `report` requests."""
    sizes = [len(body["reports"]) for _, verb, body in heard.sent if verb == "reports"]  # type: ignore[arg-type]
    return sizes, sum(1 for _, verb, _ in heard.sent if verb == "report")


async def test_reports_ending_together_go_in_fewer_requests_than_reports(lab: AgentLab) -> None:
    tasks, heard = await two_waves(lab)
    sizes, singles = reported(heard)
    print(f"batched: {len(tasks)} reports in {len(sizes)} reports requests {sizes} and {singles} report requests")
    assert sum(sizes) + singles == len(tasks), "each report sent once, answered at the first try"
    assert len(sizes) + singles < len(tasks), f"fewer requests than reports: {sizes} and {singles}"
    assert max(sizes) >= 2
    for task_id in tasks:
        assert heard.of(task_id)["report"] == 1
        assert (await lab.task(task_id))["status"] == "done"
    handed = [task_id for task_id in tasks[len(DEVICES) :] if heard.of(task_id)["claim"] == 0]
    assert handed, "queued tasks were handed over in the reports' replies, not claimed"


async def test_an_agent_that_does_not_batch_sends_one_report_per_report(lab: AgentLab) -> None:
    tasks, heard = await two_waves(lab, batch_reports=False)
    sizes, singles = reported(heard)
    print(f"one by one: {len(tasks)} reports in {len(sizes)} reports requests and {singles} report requests")
    assert sizes == []
    assert singles == len(tasks)
