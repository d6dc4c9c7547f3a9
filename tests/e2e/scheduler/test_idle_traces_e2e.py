"""An idle control plane exports no spans; a pass that did work is exported with its database operation.

The scheduler and the sweeper run as processes exporting over OTLP (configured as in production, by the
standard `OTEL_*` variables) to a real receiver, their periodic passes five times a second.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from importlib.metadata import version
from pathlib import Path

import pytest
from nats.aio.client import Client as NatsClient

from support.otlp_receiver import OtlpReceiver, ReceivedSpan, otlp_receiver
from support.polling import eventually
from support.scheduler_harness import (
    TestHost,
    api,
    delete_streams,
    plan,
    scheduler_process,
    service_env,
    submit,
    sweeper_process,
)

pytestmark = pytest.mark.e2e

#: How long the plane is left idle: at 0.2 s, some ten sweeps, assignment and relay passes each.
IDLE_S = 2.0


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    with otlp_receiver() as r:
        yield r


async def test_an_idle_plane_exports_nothing_and_a_sweep_that_ended_a_lease_is_exported(
    receiver: OtlpReceiver, nc: NatsClient, nats_url: str, database_url: str, subject_prefix: str, tmp_path: Path
) -> None:
    p = subject_prefix
    env = {
        **service_env(database_url, nats_url, p, metrics_interval_s=0.2, health_pass_interval_s=0.2),
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
        "OTEL_BSP_SCHEDULE_DELAY": "100",
        "NO_PROXY": "127.0.0.1,localhost",
    }
    scheduler = scheduler_process(env, tmp_path / "scheduler.log").start()
    sweeper = sweeper_process(env, tmp_path / "sweeper.log").start()
    host = TestHost(nc, p)
    try:
        await asyncio.gather(scheduler.wait_logged("serving"), sweeper.wait_logged("sweeping"))
        await asyncio.sleep(IDLE_S)
        idle = receiver.spans()
        assert idle == [], sorted({(s.service, s.name) for s in idle})

        # Work: a host claims the attempt of a one-attempt task and goes silent; the sweeper ends its lease.
        await host.register(("d1", {"pool": p}))
        task_id = await submit(nc, p, selector={"labels": {"pool": p}}, plan=plan("flash"), lease_ttl_s=1,
                               max_attempts=1)  # fmt: skip
        await host.claim(await host.next_assignment())

        def swept() -> list[ReceivedSpan] | None:
            return [s for s in receiver.spans() if s.name == "sweep batch"] or None

        batches = await eventually(swept, timeout=20, message="the sweep that ended the lease exported")
        assert batches is not None
        (batch,) = batches
        assert batch.service == "devsched-sweeper"
        assert batch.attributes["devsched.batch.count"] == 1
        assert batch.resource["service.version"] == version("devsched-sweeper")
        operations = [s.name for s in receiver.trace(batch.trace_id) if s.parent_span_id == batch.span_id]
        assert operations == ["sweep"], "the pass's database operation goes with it"

        submitted = [s for s in receiver.spans() if s.name == f"process {api(p, 'tasks.submit')}"]
        assert len(submitted) == 1
        assert submitted[0].resource["service.version"] == version("devsched-scheduler")
        assert task_id  # its trace is the one the submit started
        assert {s.name for s in receiver.trace(submitted[0].trace_id)} >= {"submit"}
    finally:
        await host.close()
        assert scheduler.stop() == 0
        assert sweeper.stop() == 0
        await delete_streams(nc, p)
