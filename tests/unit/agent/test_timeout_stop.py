"""A time limit in a renewal reply (`stop`): a stop like a cancellation's, reported `failed` with the limit."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from devsched.agent.keeper import LeaseKeeper
from devsched.agent.stop import StopLevel, StopReason, StopSignal
from devsched.core.leases import Extension
from devsched.core.status import Outcome
from devsched.protocol.plans import Progress, StepStatus

from .test_runner import MakeRunner, long_sleep, start, statuses, touch

pytestmark = pytest.mark.unit


async def test_a_stop_in_a_reply_is_a_timeout_stop_at_the_cancellation_level() -> None:
    stop = StopSignal()

    async def renew(progress: Progress | None) -> Extension:
        return Extension(datetime.now(UTC) + timedelta(seconds=30), 30, False, stop="attempt_timeout")

    keeper = LeaseKeeper(renew, stop)
    keeper.granted(keeper.clock.now(), dataclasses.replace(await renew(None), stop=None))
    assert stop.reason is StopReason.NONE
    await keeper.renew()
    assert (stop.reason, stop.detail, stop.level) == (StopReason.TIMEOUT, "attempt_timeout", StopLevel.STOP)
    assert keeper.live()  # the lease is still held: teardown may run


async def test_a_timeout_stop_interrupts_skips_runs_teardown_and_reports_the_limit(
    make_runner: MakeRunner, tmp_path: Path
) -> None:
    stop = StopSignal()
    steps = [
        long_sleep(interruptible=True),
        touch(tmp_path / "planned", "test"),
        touch(tmp_path / "teardown", "collect-logs", always=True),
    ]
    task = await start(make_runner(steps, stop=stop))
    started = time.monotonic()
    stop.request(StopReason.TIMEOUT, "deadline_exceeded")
    result = await asyncio.wait_for(task, 30)
    assert time.monotonic() - started < 20
    assert (result.outcome, result.reason, result.released) == (Outcome.FAILED, "deadline_exceeded", False)
    assert statuses(result) == [StepStatus.INTERRUPTED, StepStatus.SKIPPED, StepStatus.DONE]
    assert (tmp_path / "teardown").exists()
