"""The agent over real NATS/JetStream against a stand-in scheduler (no database yet).

End-to-end tests with the real scheduler, sweeper and Postgres come with those services; these pin the
agent's side of the protocol: registration, binding, claim, renewals with progress, nudges, reports
through the spool, duplicate deliveries, one attempt per device, and shutdown.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from devsched.agent.config import AgentConfig
from devsched.agent.spool import Spool, report_key
from devsched.core.status import Outcome
from devsched.protocol import messages as m
from devsched.protocol.codec import encode
from support.agent_harness import HOST, Running, shell, step
from support.fake_scheduler import FakeScheduler, Row
from support.polling import eventually

pytestmark = pytest.mark.integration

MakeConfig = Callable[..., AgentConfig]
StartAgent = Callable[[AgentConfig], Running]


async def reported(row: Row) -> m.ReportRequest:
    await eventually(lambda: row.reports, timeout=30, message="a report")
    return row.reports[0]


async def released(row: Row) -> m.ReleaseRequest:
    await eventually(lambda: row.releases, timeout=30, message="a release")
    return row.releases[0]


async def test_registers_runs_a_plan_and_reports_done(
    scheduler: FakeScheduler,
    make_config: MakeConfig,
    start_agent: StartAgent,
    tmp_path: Path,
) -> None:
    config = make_config()
    agent = start_agent(config)
    await agent.ready()
    host_id, registration = scheduler.registrations[0]
    assert host_id == HOST
    assert [(d.device_id, d.labels) for d in registration.devices] == [
        (config.devices[0].device_id, {"platform": "android"}),
        (config.devices[1].device_id, {}),
    ]
    out = tmp_path / "env.txt"
    row = await scheduler.assign(
        HOST, config.devices[0].device_id, [shell("flash", f"env > {out}; echo flashed"), step("rest", "noop")]
    )
    report = await reported(row)
    assert report.outcome.value == "done"
    assert report.reason is None
    assert report.result is not None
    assert [(s.name, s.status.value, s.output_tail) for s in report.result.steps] == [
        ("flash", "done", "flashed\n"),
        ("rest", "done", ""),
    ]
    env = dict(line.split("=", 1) for line in out.read_text().splitlines() if "=" in line)
    assert env["DEVSCHED_LEASE_ID"] == str(row.assignment.lease_id)
    assert env["DEVSCHED_TASK_ID"] == str(row.assignment.task_id)
    assert env["SERIAL"] == "d1"
    assert row.claims == 1
    assert [p.index for p in row.progress if p is not None][:2] == [0, 1]
    await eventually(lambda: not Spool(config.spool_dir).pending(), message="spool emptied")
    await eventually(lambda: scheduler.heartbeats >= 1, message="a heartbeat")
    assert await agent.shut_down() == 0


async def test_a_failing_step_is_reported_failed(
    scheduler: FakeScheduler, make_config: MakeConfig, start_agent: StartAgent
) -> None:
    config = make_config()
    await start_agent(config).ready()
    row = await scheduler.assign(HOST, config.devices[0].device_id, [shell("flash", "echo oops; exit 7")])
    report = await reported(row)
    assert report.outcome.value == "failed"
    assert report.reason == "step 'flash' failed with exit code 7"


async def test_a_nudged_cancellation_stops_quickly_and_runs_teardown(
    scheduler: FakeScheduler,
    make_config: MakeConfig,
    start_agent: StartAgent,
    tmp_path: Path,
) -> None:
    scheduler.ttl_s = 3600  # no scheduled renewal for ages: only the nudge can make the agent notice
    config = make_config()
    await start_agent(config).ready()
    steps = [
        step("wait", "sleep", {"seconds": 600}, interruptible=True),
        shell("next", f"touch {tmp_path / 'next'}"),
        shell("teardown", f"touch {tmp_path / 'teardown'}", always=True),
    ]
    row = await scheduler.assign(HOST, config.devices[0].device_id, steps)
    await eventually(lambda: row.progress, message="first step started")
    await scheduler.cancel(row)
    report = await reported(row)
    assert report.outcome.value == "cancelled"
    assert report.result is not None
    assert [s.status.value for s in report.result.steps] == ["interrupted", "skipped", "done"]
    assert not (tmp_path / "next").exists()
    assert (tmp_path / "teardown").exists()


async def test_a_rejected_renewal_fails_the_attempt_without_teardown(
    scheduler: FakeScheduler,
    make_config: MakeConfig,
    start_agent: StartAgent,
    tmp_path: Path,
) -> None:
    scheduler.ttl_s = 3  # renewals every second
    config = make_config()
    await start_agent(config).ready()
    steps = [
        step("wait", "sleep", {"seconds": 600}, interruptible=True),
        shell("teardown", f"touch {tmp_path / 'teardown'}", always=True),
    ]
    row = await scheduler.assign(HOST, config.devices[0].device_id, steps)
    await eventually(lambda: row.progress, message="first step started")
    scheduler.reject_renewals = True
    await eventually(lambda: row.status == "expired", message="a renewal rejected")
    spool = Spool(config.spool_dir)
    # The report is 409'd too (the lease is gone): moot, so it leaves the spool without being recorded.
    await eventually(lambda: scheduler.report_bodies, timeout=30, message="a report sent")
    await eventually(lambda: not spool.pending(), message="moot report removed")
    body = json.loads(scheduler.report_bodies[0])
    assert body["outcome"] == "failed"
    assert body["reason"] == "lease_lost: renewal rejected: lease_expired"
    assert [s["status"] for s in body["result"]["steps"]] == ["interrupted", "skipped"]
    assert not (tmp_path / "teardown").exists()


async def test_a_stale_assignment_is_acked_and_not_run(
    scheduler: FakeScheduler,
    make_config: MakeConfig,
    start_agent: StartAgent,
    tmp_path: Path,
) -> None:
    config = make_config()
    await start_agent(config).ready()
    # The lease ran out before the host claimed it: the claim gets 409.
    row = await scheduler.assign(
        HOST, config.devices[0].device_id, [shell("s", f"touch {tmp_path / 'ran'}")], status="expired"
    )
    fresh = await scheduler.assign(HOST, config.devices[0].device_id, [step("n", "noop")])
    await reported(fresh)  # the device went on to the next assignment
    assert row.reports == []
    assert not (tmp_path / "ran").exists()

    async def all_acked() -> bool:
        info = await scheduler.js.consumer_info(scheduler.subjects.assignments_stream, f"host-{HOST}")
        return bool(info.num_ack_pending == 0)

    await eventually(all_acked, message="the stale assignment acked")


async def test_a_duplicate_delivery_runs_once(
    scheduler: FakeScheduler,
    make_config: MakeConfig,
    start_agent: StartAgent,
    tmp_path: Path,
) -> None:
    config = make_config()
    await start_agent(config).ready()
    counter = tmp_path / "runs"
    row = await scheduler.assign(
        HOST, config.devices[0].device_id, [shell("count", f"echo x >> {counter}; sleep 0.3")], msg_id=False
    )
    await scheduler.publish(row, msg_id=False)  # the same attempt delivered twice
    await reported(row)

    async def both_settled() -> bool:
        info = await scheduler.js.consumer_info(scheduler.subjects.assignments_stream, f"host-{HOST}")
        return bool(info.delivered.stream_seq >= 2 and info.num_ack_pending == 0)

    await eventually(both_settled, message="both deliveries acked")
    assert counter.read_text() == "x\n"
    assert row.claims == 1


async def test_one_attempt_per_device_at_a_time_and_devices_in_parallel(
    scheduler: FakeScheduler,
    make_config: MakeConfig,
    start_agent: StartAgent,
    tmp_path: Path,
) -> None:
    config = make_config()
    await start_agent(config).ready()
    gate = tmp_path / "gate"
    hold = f"while [ ! -e {gate} ]; do sleep 0.02; done"
    d1, d2 = config.devices[0].device_id, config.devices[1].device_id
    first = await scheduler.assign(HOST, d1, [shell("hold", hold)])
    second = await scheduler.assign(HOST, d1, [step("n", "noop")])
    other = await scheduler.assign(HOST, d2, [step("n", "noop")])
    await reported(other)  # another device is not held up
    await eventually(lambda: first.claims == 1, message="first claimed")
    await asyncio.sleep(0.3)  # room for a wrong implementation to claim the second one too
    assert second.claims == 0
    gate.touch()
    await reported(first)
    await reported(second)
    assert first.recorded_at is not None
    assert second.claimed_at is not None
    assert second.claimed_at >= first.recorded_at


async def test_reports_are_retried_with_identical_bytes(
    scheduler: FakeScheduler, make_config: MakeConfig, start_agent: StartAgent
) -> None:
    scheduler.fail_reports = 2
    config = make_config()
    await start_agent(config).ready()
    row = await scheduler.assign(HOST, config.devices[0].device_id, [shell("s", "echo hi")])
    await reported(row)
    assert len(scheduler.report_bodies) == 3
    assert len(set(scheduler.report_bodies)) == 1


async def test_spooled_reports_are_sent_first_on_start(
    scheduler: FakeScheduler, make_config: MakeConfig, start_agent: StartAgent
) -> None:
    config = make_config()
    # A report left behind by an agent killed before the scheduler answered it.
    row = await scheduler.assign(HOST, config.devices[0].device_id, [step("n", "noop")])
    a = row.assignment
    left = m.ReportRequest(task_id=a.task_id, attempt=a.attempt, lease_id=a.lease_id, outcome=Outcome.DONE, result=None)
    body = encode(left)
    Spool(config.spool_dir).put(report_key(str(a.task_id), a.attempt), body)
    stale_body = encode(
        m.ReportRequest(task_id=uuid.uuid4(), attempt=1, lease_id=uuid.uuid4(), outcome=Outcome.FAILED, reason="old")
    )
    Spool(config.spool_dir).put(report_key("stale", 1), stale_body)
    await start_agent(config).ready()
    assert body in scheduler.report_bodies
    assert row.status == "done"
    assert Spool(config.spool_dir).pending() == []
    # The unknown task's report was not lost silently: it is kept aside after the 404s.
    assert (Path(config.spool_dir) / "rejected" / "stale.1.json").read_bytes() == stale_body


async def test_shutdown_kills_a_long_step_at_the_end_of_its_grace_and_releases(
    scheduler: FakeScheduler,
    make_config: MakeConfig,
    start_agent: StartAgent,
    tmp_path: Path,
) -> None:
    config = make_config(shutdown_grace_s=0.3)
    agent = start_agent(config)
    await agent.ready()
    started = tmp_path / "started"
    steps = [
        shell("long", f"touch {started}; exec sleep 600"),  # not interruptible: only the kill stops it
        shell("teardown", f"touch {tmp_path / 'teardown'}", always=True),
    ]
    row = await scheduler.assign(HOST, config.devices[0].device_id, steps)
    await eventually(started.exists, message="step started")
    assert await agent.shut_down() == 0
    # given back, not failed (issue 11); killed at the end of the grace, so no teardown either
    release = await released(row)
    assert row.reports == []
    assert release.reason is not None
    assert release.reason.startswith("shutdown: ")
    assert release.result is not None
    assert [s.status.value for s in release.result.steps] == ["interrupted", "skipped"]
    assert not (tmp_path / "teardown").exists()


async def test_shutdown_stops_at_a_step_boundary_runs_teardown_and_releases(
    scheduler: FakeScheduler,
    make_config: MakeConfig,
    start_agent: StartAgent,
    tmp_path: Path,
) -> None:
    config = make_config(shutdown_grace_s=0.3)
    agent = start_agent(config)
    await agent.ready()
    started = tmp_path / "started"
    steps = [
        shell("long", f"touch {started}; exec sleep 600", interruptible=True),
        shell("next", f"touch {tmp_path / 'next'}"),
        shell("teardown", f"touch {tmp_path / 'teardown'}", always=True),
    ]
    row = await scheduler.assign(HOST, config.devices[0].device_id, steps)
    await eventually(started.exists, message="step started")
    assert await agent.shut_down() == 0
    release = await released(row)
    assert row.reports == []
    assert release.result is not None
    assert [s.status.value for s in release.result.steps] == ["interrupted", "skipped", "done"]
    assert (tmp_path / "teardown").exists(), "the lease is held at a shutdown: teardown runs"
    assert not (tmp_path / "next").exists()
    assert row.status == "released"
