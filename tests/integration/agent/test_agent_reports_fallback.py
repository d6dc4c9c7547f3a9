"""An agent whose scheduler says `reports` but nothing serves the subject (a scheduler of an older release
answering during a rolling upgrade) reports one by one, and every report is recorded once."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable

import pytest
from nats.aio.client import Client

from devsched.agent.config import AgentConfig
from devsched.core.status import Outcome
from devsched.protocol import messages as m
from devsched.protocol.subjects import Subjects
from support.agent_harness import HOST, Running, shell
from support.fake_scheduler import FakeScheduler
from support.polling import eventually

pytestmark = pytest.mark.integration

MakeConfig = Callable[..., AgentConfig]
StartAgent = Callable[[AgentConfig], Running]

#: How long the fake takes to answer a report: the reports ending meanwhile wait, and go out together.
SLOW_REPORT_S = 0.3


class Advertising(FakeScheduler):
    """Says `reports` in its register and heartbeat replies, serves `report` only, and slowly."""

    async def register(self, req: m.RegisterRequest, subject: str) -> m.RegisterReply:
        return (await super().register(req, subject)).model_copy(update={"reports": True})

    async def heartbeat(self, req: m.HeartbeatRequest, subject: str) -> m.RegisterReply:
        return (await super().heartbeat(req, subject)).model_copy(update={"reports": True})

    async def report(self, req: m.ReportRequest, subject: str) -> m.ReportReply:
        await asyncio.sleep(SLOW_REPORT_S)  # a slow scheduler, not a wait of the test
        return await super().report(req, subject)


@pytest.fixture
async def advertising(nc: Client, subjects: Subjects) -> AsyncIterator[Advertising]:
    fake = Advertising(nc, subjects)
    await fake.start()
    yield fake
    await fake.stop()


async def test_reports_without_responders_fall_back_to_one_report_each(
    advertising: Advertising,
    make_config: MakeConfig,
    start_agent: StartAgent,
    subject_prefix: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    config = make_config(devices=[{"device_id": f"{subject_prefix}-d{n}"} for n in range(1, 5)])
    agent = start_agent(config)
    await agent.ready()
    plan = [shell("short", "sleep 0.5")]
    with caplog.at_level(logging.WARNING, logger="devsched.agent.reports"):
        rows = [await advertising.assign(HOST, device.device_id, plan) for device in config.devices]
        await eventually(lambda: all(row.reports for row in rows), timeout=30, message="every report")
    assert [[r.outcome for r in row.reports] for row in rows] == [[Outcome.DONE]] * len(rows), "each once"
    assert any(r.getMessage() == "reports not served, reporting one by one" for r in caplog.records)
    assert await agent.shut_down() == 0
