"""One trace follows a task: the submit's trace context reaches its events and its assignment.

The scheduler runs as a process, so tracing is set up exactly as its `main` does in production (and
no tracer provider leaks into this test process).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from nats.aio.client import Client as NatsClient

from support.polling import eventually
from support.scheduler_harness import (
    TestHost,
    api,
    delete_streams,
    plan,
    scheduler_process,
    service_env,
    stream_messages,
)

pytestmark = pytest.mark.e2e

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{TRACE_ID}-00f067aa0ba902b7-01"


def _trace_id(headers: dict[str, str] | None) -> str | None:
    value = (headers or {}).get("traceparent")
    return value.split("-")[1] if value else None


async def test_submit_trace_reaches_events_and_assignment(
    nc: NatsClient, nats_url: str, database_url: str, subject_prefix: str, tmp_path: Path
) -> None:
    scheduler = scheduler_process(service_env(database_url, nats_url, subject_prefix), tmp_path / "scheduler.log")
    scheduler.start()
    host = TestHost(nc, subject_prefix)
    try:
        await scheduler.wait_logged("serving")
        await host.register("d1", bind=False)  # nobody fetches: the assignment stays in the stream
        reply = await nc.request(
            api(subject_prefix, "tasks.submit"),
            json.dumps({"plan": plan("flash")}).encode(),
            headers={"traceparent": TRACEPARENT},
            timeout=5,
        )
        task_id = json.loads(reply.data)["task_id"]
        js = nc.jetstream()
        stream = subject_prefix.upper()

        async def traced() -> list[str | None] | None:
            events = await stream_messages(js, f"{stream}_EVENTS", f"{subject_prefix}.events.task.{task_id}")
            if len(events) < 2:
                return None
            # a work-queue stream: read the message in place rather than through a consumer
            assignment = await js.get_last_msg(f"{stream}_ASSIGNMENTS", f"{subject_prefix}.assign.{host.host_id}")
            return [_trace_id(m.headers) for m in events] + [_trace_id(assignment.headers)]

        ids = await eventually(traced, message="submitted and assigned events and the assignment published")
        # submitted: the request's own span; assigned and the assignment: the task's stored context
        assert ids == [TRACE_ID] * 3
    finally:
        await host.close()
        assert scheduler.stop() == 0
        await delete_streams(nc, subject_prefix)
