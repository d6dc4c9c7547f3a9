"""A step's progress goes to the scheduler once: on its boundary's renewal (or the claim), and periodic
renewals after that renewal was granted carry none, so the scheduler renews them without the task's lock."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from devsched.agent.config import AgentConfig
from devsched.core.status import Outcome
from devsched.protocol import messages as m
from support.agent_harness import HOST, Running, shell, step
from support.fake_scheduler import FakeScheduler
from support.polling import eventually

pytestmark = pytest.mark.integration

MakeConfig = Callable[..., AgentConfig]
StartAgent = Callable[[AgentConfig], Running]


@pytest.mark.parametrize("claim_progress", [False, True])
async def test_each_boundary_sends_its_progress_once_and_periodic_renewals_none(
    scheduler: FakeScheduler, make_config: MakeConfig, start_agent: StartAgent, claim_progress: bool
) -> None:
    scheduler.claim_progress = claim_progress
    scheduler.ttl_s = 3  # a renewal about every second
    config = make_config()
    agent = start_agent(config)
    await agent.ready()
    plan = [step("flash", "noop"), shell("wait", "sleep 2.5"), step("wipe", "noop")]
    row = await scheduler.assign(HOST, config.devices[0].device_id, plan)
    await eventually(lambda: row.reports, timeout=30, message="a report")
    assert row.reports[0].outcome is Outcome.DONE
    sent = [p for p in row.progress if p is not None]
    boundaries = [*(p for p in row.claimed_with if p is not None), *sent]
    assert [p.index for p in boundaries] == [0, 1, 2], row.progress
    assert len(sent) == (2 if claim_progress else 3)
    assert None in row.progress, "periodic renewals during the sleep, without progress"
    assert row.progress[0] == (m.Progress(step="wait", index=1, of=3) if claim_progress else boundaries[0])
    assert await agent.shut_down() == 0
