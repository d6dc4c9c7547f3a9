"""Readiness verdicts without a listener: bounded checks, and one evaluation shared by a storm of probes.

(Served as `/readyz`: tests/unit/service/test_health.py.)
"""

from __future__ import annotations

import asyncio
import time

import pytest

from devsched.service.readiness import NotReady, Readiness, reason_of

pytestmark = pytest.mark.unit


async def test_a_check_that_hangs_fails_within_its_timeout() -> None:
    readiness = Readiness(cache_s=0, check_timeout_s=0.2)

    async def hangs() -> None:
        await asyncio.sleep(60)

    readiness.add("database", hangs)
    started = time.monotonic()
    verdict = await readiness.verdict()
    assert time.monotonic() - started < 2
    assert verdict.failing == {"database": "no answer within 0.2 s"}


async def test_a_probe_storm_runs_the_checks_once_per_cache_period() -> None:
    calls = 0

    async def counted() -> None:
        nonlocal calls
        calls += 1
        await asyncio.sleep(0.05)

    readiness = Readiness(cache_s=30)
    readiness.add("database", counted)
    verdicts = await asyncio.gather(*(readiness.verdict() for _ in range(50)))
    assert all(v.ready for v in verdicts)
    assert calls == 1
    await readiness.verdict()
    assert calls == 1
    readiness.cache_s = 0
    await readiness.verdict()
    assert calls == 2


def test_a_reason_is_one_bounded_line() -> None:
    assert reason_of(NotReady("schema at 0007, code needs 0008")) == "schema at 0007, code needs 0008"
    assert reason_of(OSError()) == "OSError"
    long = reason_of(RuntimeError("x" * 1000))
    assert len(long) == 300
    assert long.startswith("RuntimeError: xxx")
    assert long.endswith("...")
