"""The agent rides out a NATS server restart: it reconnects, keeps its running attempt, renews, reports."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from devsched.agent.config import AgentConfig
from support.agent_harness import HOST, Running, shell, step
from support.fake_scheduler import FakeScheduler
from support.polling import eventually
from support.servers import NatsHandle

pytestmark = [pytest.mark.integration, pytest.mark.chaos]


async def test_a_nats_restart_mid_run_loses_nothing(
    scheduler: FakeScheduler,
    nats_server: NatsHandle,
    make_config: Callable[..., AgentConfig],
    start_agent: Callable[[AgentConfig], Running],
    tmp_path: Path,
) -> None:
    scheduler.ttl_s = 6  # renewals every 2 s, so some fall on both sides of the restart
    config = make_config()
    await start_agent(config).ready()
    started, gate = tmp_path / "started", tmp_path / "gate"
    hold = shell("hold", f"touch {started}; while [ ! -e {gate} ]; do sleep 0.02; done")
    row = await scheduler.assign(HOST, config.devices[0].device_id, [hold, step("after", "noop")])
    await eventually(started.exists, timeout=30, message="step started")
    nats_server.restart()
    renewals = len(row.progress)
    await eventually(lambda: len(row.progress) > renewals, timeout=30, message="a renewal after the restart")
    gate.touch()
    await eventually(lambda: row.reports, timeout=30, message="report after the restart")
    assert row.reports[0].outcome.value == "done"
    assert row.claims == 1
    # New work still arrives: the pull subscription works again.
    later = await scheduler.assign(HOST, config.devices[0].device_id, [step("n", "noop")])
    await eventually(lambda: later.reports, timeout=30, message="a later assignment ran")
