"""Helpers of the step-output tests: the logs stream, and a task view of a fake scheduler's attempt."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

from nats.aio.client import Client as NatsClient

from devsched.protocol import messages as m
from devsched.protocol.subjects import Subjects
from devsched.scheduler.jetstream import logs_stream_config
from devsched.scheduler.settings import SchedulerSettings

#: Attempt statuses of a fake scheduler row's `status` (the report's outcome once reported).
_ENDED = {"done", "failed", "cancelled", "released", "expired"}


@contextlib.asynccontextmanager
async def logs_stream(nc: NatsClient, subjects: Subjects, host_id: str = "h1", **settings: Any) -> AsyncIterator[str]:
    """Host `host_id`'s `<PU>_LOGS_<host_id>` as the scheduler creates it (with `settings` overriding its
    own), removed afterwards."""
    js = nc.jetstream()
    config = logs_stream_config(subjects, SchedulerSettings(subject_prefix=subjects.prefix, **settings), host_id)
    await js.add_stream(config)
    try:
        yield config.name or ""
    finally:
        with contextlib.suppress(Exception):
            await js.delete_stream(config.name or "")


def task_view(task_id: uuid.UUID, host_id: str, *attempts: tuple[int, str], status: str = "dispatched") -> m.TaskView:
    """A task view with attempts `(number, attempt status)` on `host_id`, for a `LogReader`'s probe."""
    now = datetime.now(UTC)
    return m.TaskView.model_validate(
        {
            "task_id": task_id,
            "status": status,
            "priority": 0,
            "max_attempts": 3,
            "attempt_count": len(attempts),
            "cancel_requested": False,
            "selector": {},
            "plan": {"steps": [{"name": "s", "action": "noop"}]},
            "created_at": now,
            "updated_at": now,
            "attempts": [
                {
                    "attempt": number,
                    "lease_id": uuid.uuid4(),
                    "host_id": host_id,
                    "device_id": "d1",
                    "status": attempt_status,
                    "assigned_at": now,
                    "expires_at": now,
                }
                for number, attempt_status in attempts
            ],
        },
        strict=False,
    )


def attempt_status(row_status: str) -> str:
    """The attempt status of a fake scheduler row."""
    return row_status if row_status in _ENDED else "active"
