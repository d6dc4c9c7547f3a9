"""A registration the scheduler refuses (`agent.registration`): retried with backoff, every reason logged."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import pytest

from devsched.agent.registration import Registration
from devsched.core.errors import InvalidRequest

ERRORS = [{"path": "actions.3.args_schema", "message": "args schema of flash has references that form a cycle"}]


class RefusingClient:
    """A scheduler that answers every registration 400, as it does for a schema that breaks its bounds."""

    def __init__(self) -> None:
        self.calls: list[float] = []

    async def register(self, *args: Any) -> Any:
        self.calls.append(time.monotonic())
        raise InvalidRequest(f"{ERRORS[0]['path']}: {ERRORS[0]['message']}", errors=ERRORS)


async def test_a_refused_registration_is_retried_with_backoff_and_logs_every_refused_path(
    caplog: pytest.LogCaptureFixture,
) -> None:
    client = RefusingClient()
    registration = Registration(client, [], "test", registered=asyncio.Event())  # type: ignore[arg-type]
    stop = asyncio.Event()
    asyncio.get_running_loop().call_later(1.0, stop.set)
    with caplog.at_level(logging.ERROR, logger="devsched.agent.registration"):
        assert await registration.register_until_done(stop) is False
    assert 2 <= len(client.calls) <= 5  # 0.1-0.2 s, then 0.2-0.4 s, 0.4-0.8 s: never a hot loop
    records = [r for r in caplog.records if r.getMessage() == "registration failed, will retry"]
    assert len(records) == len(client.calls)
    assert all(r.levelno == logging.ERROR for r in records)
    assert records[0].__dict__["errors"] == ERRORS
    assert "args schema of flash" in records[0].__dict__["error"]
