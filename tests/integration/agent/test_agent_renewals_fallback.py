"""An agent whose scheduler says `renewals` but nothing serves the subject (a scheduler of an older release
answering during a rolling upgrade) renews lease by lease, and its attempts run to the end."""

from __future__ import annotations

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


class Advertising(FakeScheduler):
    """Says `renewals` in its register and heartbeat replies, and serves `renew` only."""

    async def register(self, req: m.RegisterRequest, subject: str) -> m.RegisterReply:
        return (await super().register(req, subject)).model_copy(update={"renewals": True})

    async def heartbeat(self, req: m.HeartbeatRequest, subject: str) -> m.RegisterReply:
        return (await super().heartbeat(req, subject)).model_copy(update={"renewals": True})


@pytest.fixture
async def advertising(nc: Client, subjects: Subjects) -> AsyncIterator[Advertising]:
    fake = Advertising(nc, subjects, ttl_s=3)  # a renewal about every second
    await fake.start()
    yield fake
    await fake.stop()


async def test_renewals_without_responders_fall_back_to_one_renew_per_lease(
    advertising: Advertising, make_config: MakeConfig, start_agent: StartAgent, caplog: pytest.LogCaptureFixture
) -> None:
    config = make_config()
    agent = start_agent(config)
    await agent.ready()
    plan = [shell("wait", "sleep 2.5")]
    with caplog.at_level(logging.WARNING, logger="devsched.agent.renewals"):
        rows = [await advertising.assign(HOST, device.device_id, plan) for device in config.devices]
        await eventually(lambda: all(row.reports for row in rows), timeout=30, message="both reports")
    assert [row.reports[0].outcome for row in rows] == [Outcome.DONE, Outcome.DONE]
    for row in rows:
        assert None in row.progress, "periodic renewals reached `renew`, lease by lease"
    assert any(r.getMessage() == "renewals not served, renewing lease by lease" for r in caplog.records)
    assert await agent.shut_down() == 0
