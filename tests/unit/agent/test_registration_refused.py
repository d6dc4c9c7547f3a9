"""A registration refused because a device belongs to another host: said once, retried slowly, shown in readiness."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any, cast

import pytest

from devsched.agent import registration as reg
from devsched.agent.agent import Agent
from devsched.agent.client import HostClient
from devsched.agent.config import DeviceConfig
from devsched.agent.health import add_checks
from devsched.core.errors import DeviceConflict
from devsched.protocol import messages as m
from devsched.service import HealthServer, NotReady

pytestmark = pytest.mark.unit


class _Scheduler:
    """Refuses `refusals` registrations as `device_conflict` on d2, then accepts."""

    def __init__(self, refusals: int) -> None:
        self.refusals = refusals
        self.calls = 0

    async def register(self, devices: Sequence[m.DeviceRegistration], version: str, actions: Any) -> m.RegisterReply:
        self.calls += 1
        if self.calls <= self.refusals:
            raise DeviceConflict("device d2 belongs to host other", devices={"d2": "other"})
        return m.RegisterReply(heartbeat_interval_s=5)


async def test_a_refused_registration_is_logged_once_and_retried_slowly(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(reg, "CONFLICT_RETRY_S", 0.01)
    scheduler = _Scheduler(refusals=4)
    devices = [DeviceConfig(device_id="d1"), DeviceConfig(device_id="d2")]
    registration = reg.Registration(cast(HostClient, scheduler), devices, "1.0", registered=asyncio.Event())
    caplog.set_level(logging.DEBUG, logger=reg.__name__)
    seen: list[tuple[str, ...]] = []
    original = registration._refused

    def spy(exc: DeviceConflict) -> float:
        pause = original(exc)
        seen.append(registration.refused_devices)
        return pause

    monkeypatch.setattr(registration, "_refused", spy)
    assert await asyncio.wait_for(registration.register_until_done(asyncio.Event()), timeout=10)
    assert scheduler.calls == 5
    assert seen == [("d2",)] * 4, "readiness names the device while refused"
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1, "one clear line, not one per retry"
    assert "device d2 belongs to another host" in errors[0].getMessage()
    assert "devsched devices forget" in errors[0].getMessage()
    assert registration.refused_devices == (), "cleared once registered"
    assert registration.registered.is_set()


async def test_the_pause_after_a_refusal_is_the_slow_one() -> None:
    registration = reg.Registration(cast(HostClient, _Scheduler(0)), [], "1.0", registered=asyncio.Event())
    assert registration._refused(DeviceConflict("x", devices={"d9": "h"})) == reg.CONFLICT_RETRY_S >= 30


async def test_readiness_names_the_refused_devices() -> None:
    checks: dict[str, Any] = {}

    class _Health:
        def check(self, name: str, fn: Any) -> None:
            checks[name] = fn

    registration = reg.Registration(cast(HostClient, _Scheduler(0)), [], "1.0", registered=asyncio.Event())
    agent = SimpleNamespace(registered=registration.registered, registration=registration)
    add_checks(cast(HealthServer, _Health()), cast(Agent, agent))
    with pytest.raises(NotReady, match="not registered with the scheduler yet"):
        await checks["registered"]()
    registration._refused(DeviceConflict("x", devices={"d2": "other"}))
    with pytest.raises(NotReady, match="device_conflict: device d2 belongs to another host"):
        await checks["registered"]()
