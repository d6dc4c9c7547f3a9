"""`devsched-agent --config agent.toml` as a process: JSON logs, SIGTERM, spool across a restart."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from pathlib import Path

import pytest

from devsched.agent.spool import Spool
from support.agent_harness import HOST, shell
from support.fake_scheduler import FakeScheduler
from support.polling import eventually

pytestmark = pytest.mark.integration


def write_config(tmp_path: Path, nats_url: str, prefix: str, **extra: float) -> Path:
    lines = [
        f'host_id = "{HOST}"',
        f'spool_dir = "{tmp_path / "spool"}"',
        f'nats_url = "{nats_url}"',
        f'subject_prefix = "{prefix}"',
        *(f"{key} = {value}" for key, value in extra.items()),
        "[[devices]]",
        f'device_id = "{prefix}-d1"',
    ]
    path = tmp_path / "agent.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


async def start_process(config: Path) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "devsched.agent.main", "--config", str(config), stderr=asyncio.subprocess.PIPE
    )


async def test_sigterm_stops_the_running_step_releases_and_exits_0(
    scheduler: FakeScheduler, nats_url: str, subject_prefix: str, tmp_path: Path
) -> None:
    config = write_config(tmp_path, nats_url, subject_prefix, shutdown_grace_s=0.2, stop_grace_s=0.2)
    process = await start_process(config)
    try:
        await eventually(lambda: scheduler.registrations, timeout=30, message="agent registered")
        started = tmp_path / "started"
        steps = [shell("long", f"touch {started}; exec sleep 600", interruptible=True)]
        row = await scheduler.assign(HOST, f"{subject_prefix}-d1", steps)
        await eventually(started.exists, timeout=30, message="step started")
        process.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(process.wait(), 30) == 0
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    # given back rather than failed (issue 11): the task is queued again without spending an attempt
    assert row.reports == []
    assert row.releases
    assert row.releases[0].reason == "shutdown: agent shutting down"
    assert row.releases[0].result is not None
    assert [s.status.value for s in row.releases[0].result.steps] == ["interrupted"]
    assert process.stderr is not None
    lines = [json.loads(line) for line in (await process.stderr.read()).decode().splitlines() if line.strip()]
    claimed = [line for line in lines if line["msg"] == "attempt claimed"]
    assert claimed
    assert claimed[0]["task_id"] == str(row.assignment.task_id)
    assert claimed[0]["lease_id"] == str(row.assignment.lease_id)
    assert claimed[0]["attempt"] == 1
    assert claimed[0]["host_id"] == HOST


async def test_a_killed_agent_resends_its_spooled_report_after_restart(
    scheduler: FakeScheduler, nats_url: str, subject_prefix: str, tmp_path: Path
) -> None:
    scheduler.fail_reports = 10**6  # the scheduler answers no report: it stays in the spool
    config = write_config(tmp_path, nats_url, subject_prefix)
    process = await start_process(config)
    try:
        await eventually(lambda: scheduler.registrations, timeout=30, message="agent registered")
        row = await scheduler.assign(HOST, f"{subject_prefix}-d1", [shell("s", "echo done")])
        spool = Spool(tmp_path / "spool")
        await eventually(lambda: scheduler.report_bodies, timeout=30, message="a report tried")
        assert len(spool.pending()) == 1
        process.kill()
        await process.wait()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    scheduler.fail_reports = 0
    restarted = await start_process(config)
    try:
        await eventually(lambda: row.reports, timeout=30, message="report delivered after the restart")
        assert row.reports[0].outcome.value == "done"
        await eventually(lambda: not spool.pending(), message="spool emptied")
        assert len(set(scheduler.report_bodies)) == 1  # every try carried the identical bytes
    finally:
        restarted.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(restarted.wait(), 30) == 0
