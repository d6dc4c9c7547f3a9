"""Traces that arrive: one trace from a submit to its report, exported over OTLP by every process.

The scheduler, sweeper and agent run as processes configured by the standard `OTEL_*` variables only,
exporting to a real OTLP/HTTP receiver (`support.otlp_receiver`); the test itself submits inside a span
of its own, exported the same way. The task renews its lease at its second step's boundary, so the trace
holds a submit, the assignment's publication, the agent's processing of it, a claim, a renewal, the steps
and the report, each seen from both sides where the scheduler serves a request.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from importlib.metadata import version
from pathlib import Path

import pytest
from nats.aio.client import Client as NatsClient
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import SpanKind, Tracer

from devsched.protocol.tracing import inject
from support.agent_e2e import PLANE_SETTINGS, AgentLab, Plane, shell
from support.otlp_receiver import OtlpReceiver, ReceivedSpan, otlp_receiver
from support.polling import eventually
from support.scheduler_harness import api, delete_streams_at, scheduler_process, service_env, sweeper_process

pytestmark = pytest.mark.e2e


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    with otlp_receiver() as r:
        yield r


def _otel_env(receiver: OtlpReceiver) -> dict[str, str]:
    return {
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
        "OTEL_BSP_SCHEDULE_DELAY": "100",
        "OTEL_RESOURCE_ATTRIBUTES": "deployment.environment.name=test",
        "NO_PROXY": "127.0.0.1,localhost",
    }


@pytest.fixture
async def traced_lab(
    receiver: OtlpReceiver, database_url: str, nats_url: str, subject_prefix: str, nc: NatsClient, tmp_path: Path
) -> AsyncIterator[AgentLab]:
    """A control plane and a lab whose processes export their spans to `receiver`."""
    logs = tmp_path / "plane"
    logs.mkdir()
    env = {**service_env(database_url, nats_url, subject_prefix, **PLANE_SETTINGS), **_otel_env(receiver)}
    scheduler = scheduler_process(env, logs / "scheduler-0.log").start()
    sweeper = sweeper_process(env, logs / "sweeper.log").start()
    plane = Plane(subject_prefix, database_url, nats_url, env, logs, scheduler, sweeper)
    lab = AgentLab(nc, plane, tmp_path)
    try:
        await plane.ready()
        yield lab
    finally:
        await asyncio.to_thread(lab.stop)
        await asyncio.to_thread(plane.stop)
        await delete_streams_at(nats_url, subject_prefix)


def _client_tracer(receiver: OtlpReceiver) -> tuple[TracerProvider, Tracer]:
    """The test's own provider (never the process's), exporting at once to `receiver`."""
    provider = TracerProvider(resource=Resource({"service.name": "devsched-test-client"}), shutdown_on_exit=False)
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=f"{receiver.endpoint}/v1/traces")))
    return provider, provider.get_tracer("test")


def _one(spans: list[ReceivedSpan], name: str, service: str) -> ReceivedSpan:
    found = [s for s in spans if s.name == name and s.service == service]
    assert found, f"no span {name!r} of {service}; the trace has {sorted({(s.service, s.name) for s in spans})}"
    return found[0]


async def test_one_trace_runs_from_submit_through_claim_renewal_steps_and_report(
    traced_lab: AgentLab, receiver: OtlpReceiver
) -> None:
    lab, p = traced_lab, traced_lab.prefix
    agent = await lab.agent("d1", agent_env=_otel_env(receiver)).ready()
    provider, tracer = _client_tracer(receiver)
    body = {
        "selector": {"labels": lab.label},
        "plan": {"steps": [shell("first", "sleep 0.3"), shell("second", "true")]},
        "lease_ttl_s": 5,
    }
    with tracer.start_as_current_span("submit task", kind=SpanKind.CLIENT) as root:
        reply = await lab.nc.request(api(p, "tasks.submit"), json.dumps(body).encode(), timeout=5, headers=inject())
    provider.shutdown()
    trace_id = f"{root.get_span_context().trace_id:032x}"
    root_span_id = f"{root.get_span_context().span_id:016x}"
    task_id = json.loads(reply.data)["task_id"]
    await lab.wait_status(task_id, "done")

    scheduler, agent_service = "devsched-scheduler", "devsched-agent"
    host = "{host_id}"
    wanted = [
        ("submit task", "devsched-test-client"),
        (f"process {p}.api.tasks.submit", scheduler),
        ("submit", scheduler),  # the store's operation
        (f"publish {p}.assign.{host}", scheduler),
        (f"process {p}.assign.{host}", agent_service),
        *[
            (f"{op} {p}.host.{host}.{verb}", svc)
            # the boundary's renewal goes in a `renewals` request (the agent batches its renewals); the store
            # renews a lease with progress as `renew` does
            for verb in ("claim", "renewals", "report")
            for op, svc in (("send", agent_service), ("process", scheduler))
        ],
        ("claim", scheduler),
        ("renew", scheduler),
        ("report", scheduler),
        ("step shell", agent_service),
    ]

    def arrived() -> list[ReceivedSpan] | None:
        spans = receiver.trace(trace_id)
        have = {(s.name, s.service) for s in spans}
        return spans if all(w in have for w in wanted) else None

    spans = await eventually(arrived, timeout=20, message=f"every span of the task's trace {trace_id} exported")
    assert spans is not None

    # Parentage across processes: the agent's processing continues the publication, the scheduler's
    # handling of a claim continues the agent's request.
    publish = _one(spans, f"publish {p}.assign.{host}", scheduler)
    process = _one(spans, f"process {p}.assign.{host}", agent_service)
    assert process.parent_span_id == publish.span_id
    assert process.kind == "SPAN_KIND_CONSUMER"
    assert publish.kind == "SPAN_KIND_PRODUCER"
    assert publish.attributes["messaging.operation.name"] == "publish"
    assert publish.attributes["messaging.destination.template"] == f"{p}.assign.{host}"
    assert publish.attributes["messaging.destination.name"] == f"{p}.assign.{agent.host_id}"
    claim_sent = _one(spans, f"send {p}.host.{host}.claim", agent_service)
    claim_served = _one(spans, f"process {p}.host.{host}.claim", scheduler)
    assert claim_sent.parent_span_id == process.span_id
    assert claim_served.parent_span_id == claim_sent.span_id
    assert _one(spans, "claim", scheduler).attributes["db.system.name"] == "postgresql"
    steps = sorted(
        (s.attributes["devsched.step.index"], s.attributes["devsched.step.status"])
        for s in spans
        if s.name == "step shell"
    )
    assert steps == [(0, "done"), (1, "done")]
    assert _one(spans, f"process {p}.api.tasks.submit", scheduler).parent_span_id == root_span_id
    assert {s.service for s in spans} >= {scheduler, agent_service, "devsched-test-client"}

    # Every process exports with the resource attributes, its version among them; nothing of a pass that found
    # no work (the sweeper swept five times a second and expired nothing) and nothing of the heartbeats (the
    # agent sent one every half second).
    every = receiver.spans()
    assert all(
        s.resource.get("deployment.environment.name") == "test" for s in every if s.service != "devsched-test-client"
    )
    assert {s.resource.get("service.version") for s in every if s.service == agent_service} == {
        version("devsched-agent")
    }
    assert not [s for s in every if s.name == "sweep batch" or "heartbeat" in s.name]
    assert all(s.attributes["devsched.batch.count"] > 0 for s in every if s.name == "assign batch")
