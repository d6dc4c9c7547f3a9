"""The real agent renews all its leases in one `renewals` request per renewal interval against the real
scheduler (processes, with the sweeper, NATS and Postgres): counted on the host's subjects beside the
scheduler. A cancellation still stops only its task, a lease the scheduler rejects in a batch stops only its
attempt, and an agent told not to batch renews lease by lease."""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from nats.aio.client import Client as NatsClient

from support.agent_e2e import AgentLab, AgentProcess, Plane, shell
from support.host_requests import HostRequests, listening
from support.invariants import plain_dsn

pytestmark = pytest.mark.integration

TTL_S = 3  # a periodic renewal due about every second
INTERVAL_S = TTL_S / 3
DEVICES = [f"d{n}" for n in range(1, 9)]
#: A long step: nothing but periodic renewals while it runs (the claim carried its progress).
LONG = shell("work", "sleep 40")


@pytest.fixture
async def lab(agent_plane: Plane, nc: NatsClient, tmp_path: Path) -> AsyncIterator[AgentLab]:
    lab = AgentLab(nc, agent_plane, tmp_path)
    yield lab
    await asyncio.to_thread(lab.stop)


#: Many short steps: each boundary renews at once (with its progress), riding along with the batches.
STEPS = [shell(f"s{n}", "sleep 1") for n in range(30)]


async def eight_running(
    lab: AgentLab, agent: AgentProcess, plan: list[dict[str, Any]] | None = None, **fields: object
) -> list[str]:
    """Eight tasks (of one long step by default), one on each device of `agent`, all dispatched (running)."""
    tasks = [await lab.submit(plan or [LONG], lease_ttl_s=TTL_S, **fields) for _ in DEVICES]
    for task_id in tasks:
        await lab.wait_status(task_id, "dispatched", within=30)
    return tasks


def leases_of(body: dict[str, object]) -> list[str]:
    leases = body["leases"]
    assert isinstance(leases, list)
    return [str(lease["task_id"]) for lease in leases]


async def window(heard: HostRequests, seconds: float) -> tuple[list[dict[str, object]], list[dict[str, object]]]:
    """The `renewals` and `renew` requests heard over the next `seconds`."""
    start = time.monotonic()
    await asyncio.sleep(seconds)  # a counting window, not a wait for a condition
    return heard.since(start, "renewals"), heard.since(start, "renew")


async def test_eight_leases_are_renewed_in_about_one_request_per_interval(lab: AgentLab) -> None:
    agent = await lab.agent(*DEVICES).ready()
    async with listening(lab.nc, lab.prefix, agent.host_id) as heard:
        tasks = await eight_running(lab, agent)
        await asyncio.sleep(3 * INTERVAL_S)  # the keepers align within two intervals
        seconds = 8 * INTERVAL_S
        batches, renews = await window(heard, seconds)
        sizes = [len(leases_of(body)) for body in batches]
        print(f"batched: {len(batches)} renewals requests and {len(renews)} renew in {seconds:.0f} s; sizes {sizes}")
        assert renews == [], "no per-lease renewal in steady state"
        assert 4 <= len(batches) <= 14, f"about one request per interval, not one per lease: {sizes}"
        assert statistics.median(sizes) == 8, f"each request carries all eight leases: {sizes}"
        assert {task_id for body in batches for task_id in leases_of(body)} == set(tasks)
        for task_id in tasks:
            assert (await lab.task(task_id))["status"] == "dispatched"


async def test_a_cancellation_stops_only_its_task_at_its_next_step_boundary(lab: AgentLab) -> None:
    agent = await lab.agent(*DEVICES).ready()
    async with listening(lab.nc, lab.prefix, agent.host_id) as heard:
        tasks = await eight_running(lab, agent, STEPS)
        cancelled, *others = tasks
        await lab.cancel(cancelled)
        view = await lab.wait_status(cancelled, "cancelled", within=20)
        statuses = [step["status"] for step in view["result"]["steps"]]
        ran = statuses.count("done")
        assert 1 <= ran < len(STEPS), statuses
        assert statuses == ["done"] * ran + ["skipped"] * (len(STEPS) - ran), "the running step ended, no other started"
        batches, _ = await window(heard, 4 * INTERVAL_S)
        assert batches, "the others are still renewed in batches"
        assert all(set(leases_of(body)) <= set(others) for body in batches)
        assert {task_id for body in batches for task_id in leases_of(body)} == set(others)
        for task_id in others:
            assert (await lab.task(task_id))["status"] == "dispatched"


async def test_a_lease_rejected_in_a_batch_stops_only_its_attempt(lab: AgentLab) -> None:
    agent = await lab.agent(*DEVICES).ready()
    async with listening(lab.nc, lab.prefix, agent.host_id) as heard:
        tasks = await eight_running(lab, agent, max_attempts=1)
        rejected, *others = tasks
        # the attempt's lease runs out in the database: the sweeper ends it (the task fails, out of
        # attempts), and the agent's next batch gets a 409 for this lease and for no other
        conn = await asyncpg.connect(plain_dsn(lab.plane.database_url), timeout=10)
        try:
            await conn.execute(
                "UPDATE attempts SET expires_at = clock_timestamp() - interval '1 second' WHERE task_id = $1",
                rejected,
            )
        finally:
            await conn.close()
        await lab.wait_status(rejected, "failed", within=20)
        line = await agent.wait_line("lease lost", task_id=rejected, timeout=20)
        assert "renewal rejected" in str(line.get("detail")), line
        assert [entry["task_id"] for entry in agent.lines("lease lost")] == [rejected]
        batches, renews = await window(heard, 4 * INTERVAL_S)
        assert renews == []
        assert {task_id for body in batches for task_id in leases_of(body)} == set(others)
        for task_id in others:
            assert (await lab.task(task_id))["status"] == "dispatched"


async def test_an_agent_that_does_not_batch_renews_lease_by_lease(lab: AgentLab) -> None:
    agent = await lab.agent(*DEVICES, batch_renewals=False).ready()
    async with listening(lab.nc, lab.prefix, agent.host_id) as heard:
        tasks = await eight_running(lab, agent)
        await asyncio.sleep(INTERVAL_S)
        seconds = 8 * INTERVAL_S
        batches, renews = await window(heard, seconds)
        print(f"lease by lease: {len(batches)} renewals requests and {len(renews)} renew in {seconds:.0f} s")
        assert batches == []
        assert {str(body["task_id"]) for body in renews} == set(tasks)
        assert len(renews) >= 3 * len(tasks), "each lease renewed on its own, about once an interval"
