"""The agent's claim carries the first step's progress when the scheduler says it may, and that step's
boundary then renews no more; against a scheduler that does not say so (or refuses the field after
all) it claims as before and renews at every boundary."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from devsched.agent.config import AgentConfig
from devsched.core.status import Outcome
from devsched.protocol import messages as m
from support.agent_harness import HOST, Running, shell, step
from support.fake_scheduler import FakeScheduler, Row
from support.polling import eventually

pytestmark = pytest.mark.integration

MakeConfig = Callable[..., AgentConfig]
StartAgent = Callable[[AgentConfig], Running]


async def reported(row: Row) -> m.ReportRequest:
    await eventually(lambda: row.reports, timeout=30, message="a report")
    return row.reports[0]


def indexes(progress: list[m.Progress | None]) -> list[int | None]:
    return [None if p is None else p.index for p in progress]


async def test_the_claim_carries_the_first_step_and_only_later_boundaries_renew(
    scheduler: FakeScheduler, make_config: MakeConfig, start_agent: StartAgent
) -> None:
    scheduler.claim_progress = True
    config = make_config()
    agent = start_agent(config)
    await agent.ready()
    device = config.devices[0].device_id
    one = await scheduler.assign(HOST, device, [step("only", "noop")])
    assert (await reported(one)).outcome is Outcome.DONE
    assert indexes(one.claimed_with) == [0]
    assert one.claimed_with[0] == m.Progress(step="only", index=0, of=1)
    assert one.progress == [], "no renewal: the claim stood in for the only boundary"

    two = await scheduler.assign(HOST, device, [step("flash", "noop"), step("test", "noop")])
    assert (await reported(two)).outcome is Outcome.DONE
    assert indexes(two.claimed_with) == [0]
    assert indexes(two.progress) == [1]
    assert await agent.shut_down() == 0


async def test_without_the_schedulers_word_the_claim_is_as_before(
    scheduler: FakeScheduler, make_config: MakeConfig, start_agent: StartAgent
) -> None:
    config = make_config()
    agent = start_agent(config)
    await agent.ready()
    row = await scheduler.assign(HOST, config.devices[0].device_id, [step("only", "noop")])
    assert (await reported(row)).outcome is Outcome.DONE
    assert row.claimed_with == [None]
    assert indexes(row.progress) == [0]
    assert await agent.shut_down() == 0


async def test_a_claim_refused_for_its_progress_is_sent_again_without(
    scheduler: FakeScheduler, make_config: MakeConfig, start_agent: StartAgent
) -> None:
    scheduler.claim_progress = True  # said so, yet answers as a scheduler that does not know the field
    scheduler.refuse_claim_progress = True
    config = make_config()
    agent = start_agent(config)
    await agent.ready()
    row = await scheduler.assign(HOST, config.devices[0].device_id, [step("only", "noop")])
    assert (await reported(row)).outcome is Outcome.DONE
    assert row.claimed_with == [None]
    assert indexes(row.progress) == [0], "the first boundary renews, as without the claim's progress"
    assert await agent.shut_down() == 0


async def test_a_cancellation_in_the_claim_reply_stops_before_the_first_step(
    scheduler: FakeScheduler, make_config: MakeConfig, start_agent: StartAgent, tmp_path: Path
) -> None:
    scheduler.claim_progress = True
    config = make_config()
    agent = start_agent(config)
    await agent.ready()
    marker = tmp_path / "ran"
    steps = [shell("work", f"touch {marker}"), step("teardown", "noop", always=True)]
    # pending before the agent claims: the claim's reply says so
    row = await scheduler.assign(HOST, config.devices[0].device_id, steps, cancel_requested=True)
    report = await reported(row)
    assert report.outcome is Outcome.CANCELLED
    assert report.result is not None
    assert [(s.name, s.status.value) for s in report.result.steps] == [("work", "skipped"), ("teardown", "done")]
    assert indexes(row.claimed_with) == [0]
    assert indexes(row.progress) == [1], "only the teardown's boundary renews"
    assert not marker.exists()
    assert await agent.shut_down() == 0
