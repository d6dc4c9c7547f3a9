"""A report the scheduler keeps failing on (500) is parked, shown in readiness and metrics, sent at the next start.

Against a real agent and NATS with the stand-in scheduler, which answers reports `internal` while told to.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable

import pytest

from devsched.agent.config import AgentConfig
from devsched.agent.metrics import REGISTRY
from devsched.agent.spool import Spool
from devsched.protocol import messages as m
from support.agent_harness import HOST, Running
from support.fake_scheduler import FakeScheduler
from support.polling import eventually

pytestmark = pytest.mark.integration

MakeConfig = Callable[..., AgentConfig]
StartAgent = Callable[[AgentConfig], Running]


async def readyz(port: int) -> dict[str, object]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /readyz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    await writer.drain()
    raw = await reader.read()
    writer.close()
    body = json.loads(raw.split(b"\r\n\r\n", 1)[1])
    assert isinstance(body, dict)
    return body


async def test_a_report_failing_with_internal_is_parked_then_sent_at_the_next_start(
    scheduler: FakeScheduler, make_config: MakeConfig, start_agent: StartAgent
) -> None:
    config = make_config(report_park_after_s=1.0, metrics_port=0)
    scheduler.internal_reports = True
    first = start_agent(config)
    await first.ready()
    before = REGISTRY.get_sample_value("devsched_agent_reports_parked_total") or 0.0
    row = await scheduler.assign(
        HOST, config.devices[0].device_id, [m.Step(name="s", action="shell", args={"command": "printf 'a\\0b'"})]
    )
    await eventually(lambda: first.agent.parked_reports, timeout=30, message="the report parked")
    tries = len(scheduler.report_bodies)
    assert tries >= 2  # retried, with backoff, for report_park_after_s
    # Parked: kept in the spool, counted, and readiness says so; no more tries in this run.
    assert [r.key for r in Spool(config.spool_dir).pending()] == list(first.agent.parked_reports)
    assert REGISTRY.get_sample_value("devsched_agent_reports_parked_total") == before + 1
    assert REGISTRY.get_sample_value("devsched_agent_reports_parked_now") == 1
    assert first.agent.health is not None
    verdict = await readyz(first.agent.health.port)
    assert verdict["ready"] is False, verdict
    checks = verdict["checks"]
    assert isinstance(checks, dict)
    assert checks["reports"]["ok"] is False
    assert "parked" in checks["reports"]["error"], verdict
    await asyncio.sleep(1.5)
    assert len(scheduler.report_bodies) == tries
    assert row.status != "done"
    assert await first.shut_down() == 0

    # The scheduler is fixed; the next start sends the parked report, which then leaves the spool.
    scheduler.internal_reports = False
    second = start_agent(config)
    await second.ready()
    await eventually(lambda: row.status == "done", timeout=30, message="the parked report recorded at the next start")
    await eventually(lambda: Spool(config.spool_dir).pending() == [], timeout=10, message="the spool emptied")
    assert second.agent.parked_reports == set()
    # The step's NUL was made storable: the body has U+FFFD where the step printed NUL.
    report = json.loads(scheduler.report_bodies[-1])
    assert report["result"]["steps"][0]["output_tail"] == "a\ufffdb"


def test_the_default_park_limit_is_ten_minutes(make_config: MakeConfig) -> None:
    assert make_config().report_park_after_s == 600.0
