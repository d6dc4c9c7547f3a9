"""The agent's report takes the device's next attempt when the scheduler says it may (`take_next`): the one the
reply hands over runs without a claim or an assignment message, once, even when the reply is lost and the
repeat hands it again or a copy of its assignment arrives; against a scheduler that does not say so (or
refuses the field after all) it reports as before."""

from __future__ import annotations

import asyncio
import json
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


async def reported(row: Row, count: int = 1) -> list[m.ReportRequest]:
    await eventually(lambda: len(row.reports) >= count, timeout=30, message=f"{count} report(s)")
    return row.reports


def asked(scheduler: FakeScheduler) -> list[bool]:
    """Whether each report sent (by its bytes) asked for the next attempt."""
    return [bool(json.loads(body).get("take_next")) for body in scheduler.report_bodies]


async def test_the_reply_hands_the_next_attempt_over_and_it_runs_without_a_claim(
    scheduler: FakeScheduler, make_config: MakeConfig, start_agent: StartAgent
) -> None:
    scheduler.take_next = scheduler.claim_progress = True
    config = make_config()
    agent = start_agent(config)
    await agent.ready()
    device = config.devices[0].device_id
    two = scheduler.hand_next(HOST, device, [step("flash", "noop"), step("test", "noop")])
    three = scheduler.hand_next(HOST, device, [step("only", "noop")])
    one = await scheduler.assign(HOST, device, [step("only", "noop")])
    assert (await reported(three))[0].outcome is Outcome.DONE
    for row in (one, two, three):
        assert len(row.reports) == 1
        assert row.reports[0].take_next, "the device still takes work: every report asks"
    assert one.claims == 1
    assert (two.claims, three.claims) == (0, 0), "handed over: never claimed"
    assert two.progress == [m.Progress(step="test", index=1, of=2)], "the first boundary was the hand-over's"
    assert three.progress == []
    assert await agent.shut_down() == 0


async def test_a_lost_reply_hands_the_same_attempt_again_and_it_runs_once(
    scheduler: FakeScheduler, make_config: MakeConfig, start_agent: StartAgent
) -> None:
    scheduler.take_next = True
    config = make_config()
    agent = start_agent(config)
    await agent.ready()
    device = config.devices[0].device_id
    two = scheduler.hand_next(HOST, device, [step("only", "noop")])
    scheduler.lose_report_replies = 1  # the first report is recorded (and hands two over), its reply lost
    one = await scheduler.assign(HOST, device, [step("only", "noop")])
    await reported(two)
    assert len(one.reports) == 2, "the report was sent again"
    assert scheduler.to_hand == []
    await scheduler.publish(two)  # and a copy of its assignment arrives too (as a resync would send one)
    later = await scheduler.assign(HOST, device, [step("after", "noop")])
    await reported(later)
    assert len(two.reports) == 1, "run once"
    assert two.claims == 0
    assert await agent.shut_down() == 0


async def test_without_the_schedulers_word_a_report_takes_nothing(
    scheduler: FakeScheduler, make_config: MakeConfig, start_agent: StartAgent
) -> None:
    config = make_config()
    agent = start_agent(config)
    await agent.ready()
    device = config.devices[0].device_id
    waiting = scheduler.hand_next(HOST, device, [step("only", "noop")])
    one = await scheduler.assign(HOST, device, [step("only", "noop")])
    await reported(one)
    assert asked(scheduler) == [False], "the report of an older agent: no field"
    assert scheduler.to_hand == [waiting]
    assert await agent.shut_down() == 0


async def test_a_report_refused_for_take_next_is_sent_again_without(
    scheduler: FakeScheduler, make_config: MakeConfig, start_agent: StartAgent
) -> None:
    scheduler.take_next = True  # said so, yet answers as a scheduler that does not know the field
    scheduler.refuse_take_next = True
    config = make_config()
    agent = start_agent(config)
    await agent.ready()
    device = config.devices[0].device_id
    one = await scheduler.assign(HOST, device, [step("only", "noop")])
    await reported(one)
    assert one.reports[0].take_next is False
    await eventually(lambda: asked(scheduler) == [True, False], timeout=10, message="refused, then sent without")
    two = await scheduler.assign(HOST, device, [step("only", "noop")])
    await reported(two)
    assert asked(scheduler)[-1] is False, "not asked again until a register or heartbeat reply says so"
    assert await agent.shut_down() == 0


async def test_a_draining_agent_takes_nothing_next(
    scheduler: FakeScheduler, make_config: MakeConfig, start_agent: StartAgent, tmp_path: Path
) -> None:
    scheduler.take_next = True
    config = make_config()
    agent = start_agent(config)
    await agent.ready()
    device = config.devices[0].device_id
    gate, started = tmp_path / "gate", tmp_path / "started"
    waiting = scheduler.hand_next(HOST, device, [step("only", "noop")])
    one = await scheduler.assign(
        HOST, device, [shell("wait", f"touch {started}; while [ ! -e {gate} ]; do sleep 0.05; done")]
    )
    await eventually(started.exists, timeout=30, message="the step started")
    agent.agent.request_drain("signal", "test")
    await eventually(lambda: agent.agent.draining.is_set(), message="draining")
    gate.touch()
    (report,) = await reported(one)
    assert report.outcome is Outcome.DONE
    assert asked(scheduler) == [False], "draining: the device takes no more work"
    assert scheduler.to_hand == [waiting]
    assert await asyncio.wait_for(agent.task, 30) == 0, "drained and idle: the agent exits"
