"""Prometheus metrics (issue 14 item 1), scraped over HTTP from the real scheduler, sweeper and agent processes.

One workload: tasks the real agent runs to the end (a `noop` and a `shell` step that outlives a third of
its lease, so the agent renews), a queued task no device matches (cancelled, and one left queued at high
priority), and a protocol-only host that claims an attempt and goes silent, so that the sweeper expires its
lease and fails the task, and its late renewal is answered 409. Then every metric the issue names is
scraped from the process that exports it, parsed with `prometheus_client.parser`, and checked against
what the workload did; and no id of a task, host or device appears anywhere in an exposition.
"""

from __future__ import annotations

import platform
import uuid
from collections.abc import AsyncIterator
from importlib.metadata import version
from pathlib import Path

import pytest
from nats.aio.client import Client as NatsClient

from devsched.embedded import free_port
from support.agent_e2e import PLANE_SETTINGS, AgentLab, Plane, noop, shell
from support.polling import eventually
from support.scheduler_harness import (
    ErrorReply,
    TestHost,
    api,
    call,
    delete_streams_at,
    scheduler_process,
    service_env,
    sweeper_process,
)
from support.scrape import Scrape, scrape

pytestmark = pytest.mark.e2e

#: Tasks the agent runs to the end.
DONE = 3


class Ports:
    """The metrics ports of the three processes."""

    def __init__(self) -> None:
        self.scheduler, self.sweeper, self.agent = free_port(), free_port(), free_port()


@pytest.fixture
def ports() -> Ports:
    """Free loopback ports for the processes' `/metrics`."""
    return Ports()


@pytest.fixture
async def metrics_plane(
    database_url: str, nats_url: str, subject_prefix: str, tmp_path: Path, ports: Ports
) -> AsyncIterator[Plane]:
    """A scheduler and a sweeper, each with its own metrics port; the scheduler reads its gauges twice a second."""
    logs = tmp_path / "plane"
    logs.mkdir()
    env = service_env(database_url, nats_url, subject_prefix, **PLANE_SETTINGS)
    scheduler_env = {**env, "DEVSCHED_METRICS_PORT": str(ports.scheduler), "DEVSCHED_METRICS_INTERVAL_S": "0.5"}
    sweeper_env = {**env, "DEVSCHED_METRICS_PORT": str(ports.sweeper)}
    plane = Plane(
        subject_prefix,
        database_url,
        nats_url,
        env,
        logs,
        scheduler_process(scheduler_env, logs / "scheduler-0.log").start(),
        sweeper_process(sweeper_env, logs / "sweeper.log").start(),
    )
    try:
        await plane.ready()
        yield plane
    finally:
        plane.stop()
        await delete_streams_at(nats_url, subject_prefix)


@pytest.fixture
async def metrics_lab(metrics_plane: Plane, nc: NatsClient, tmp_path: Path) -> AsyncIterator[AgentLab]:
    """The lab of this test on its own plane; agents stopped before the plane."""
    lab = AgentLab(nc, metrics_plane, tmp_path)
    yield lab
    lab.stop()


async def _expire_a_lease(nc: NatsClient, prefix: str) -> tuple[TestHost, str, str]:
    """A host that claims an attempt of a one-attempt task and goes silent; the host, its device, the task."""
    host = TestHost(nc, prefix)
    device = f"silent-{uuid.uuid4().hex[:8]}"
    await host.register((device, {"silent": device}))
    body = {"selector": {"labels": {"silent": device}}, "plan": {"steps": [noop("n")]}, "lease_ttl_s": 1,
            "max_attempts": 1}  # fmt: skip
    task_id = str((await call(nc, api(prefix, "tasks.submit"), body))["task_id"])
    assigned = await host.next_assignment()
    await host.claim(assigned)

    async def failed() -> bool:
        view = await call(nc, api(prefix, "tasks.get"), {"task_id": task_id})
        return bool(view["status"] == "failed")

    await eventually(failed, timeout=20, message="the silent host's lease expired and its task failed")
    with pytest.raises(ErrorReply) as late:
        await host.renew(assigned)
    assert late.value.status == 409, late.value
    return host, device, task_id


async def test_every_named_metric_is_scraped_with_the_workloads_values(
    metrics_lab: AgentLab, nc: NatsClient, ports: Ports
) -> None:
    lab, prefix = metrics_lab, metrics_lab.prefix
    agent = lab.agent("d1", "d2", metrics_port=ports.agent)
    await agent.ready()

    done = [await lab.submit([noop("a"), noop("b")]) for _ in range(DONE - 1)]
    done.append(await lab.submit([shell("wait", "sleep 1.5")], lease_ttl_s=1))
    unmatched = {"selector": {"labels": {"nowhere": prefix}}, "plan": {"steps": [noop("n")]}}
    cancelled = str((await call(nc, api(prefix, "tasks.submit"), unmatched))["task_id"])
    queued = str((await call(nc, api(prefix, "tasks.submit"), {**unmatched, "priority": 5}))["task_id"])
    await lab.cancel(cancelled)
    for task_id in done:
        await lab.wait_status(task_id, "done")
    host, silent_device, expired = await _expire_a_lease(nc, prefix)
    await host.close()

    async def scheduler_caught_up() -> Scrape | None:
        s = await scrape(ports.scheduler)
        settled = (
            s.value("devsched_tasks", status="done") == DONE
            and s.value("devsched_tasks", status="failed") == 1
            and s.value("devsched_hosts", state="offline") == 1
        )
        return s if settled else None

    sched = await eventually(scheduler_caught_up, timeout=20, message="the scheduler's gauges show the workload")
    assert sched is not None

    # -- the scheduler: gauges from the database
    assert sched.value("devsched_tasks", status="cancelled") == 1
    assert sched.value("devsched_tasks", status="queued") == 1
    assert sched.value("devsched_tasks", status="dispatched") == 0
    assert sched.value("devsched_queued_tasks", priority="high") == 1
    assert sched.value("devsched_queued_tasks", priority="normal") == 0
    assert sched.value("devsched_queued_tasks", priority="low") == 0
    assert (sched.value("devsched_queue_oldest_age_seconds", priority="high") or 0) > 0
    assert sched.value("devsched_queue_oldest_age_seconds", priority="normal") == 0
    assert sched.value("devsched_hosts", state="online") == 1  # the agent
    assert sched.value("devsched_devices", state="available") == 2
    assert sched.value("devsched_devices", state="offline") == 1  # the silent host's
    assert sched.value("devsched_devices", state="reserved") == 0
    assert sched.value("devsched_devices", state="drained") == 0
    assert sched.value("devsched_outbox_unsent") is not None
    assert 0 <= (sched.value("devsched_outbox_lag_seconds") or 0) < 30
    assert (sched.value("devsched_gauges_refreshed_timestamp_seconds") or 0) > 0

    # -- the scheduler: counted where it happens
    tasks = DONE + 3
    assert sched.value("devsched_reports_total", code="ok") == DONE
    assert sched.total("devsched_renewals_total", code="ok") >= 1  # the shell step outlived a third of its lease
    # the silent host's late renewal: its task failed meanwhile
    assert sched.value("devsched_conflicts_total", code="task_terminal") == 1
    assert sched.value("devsched_renewals_total", code="task_terminal") == 1
    # Each attempt once: the agent's tasks and the silent host's (the unmatched ones were never assigned).
    assert sched.value("devsched_submit_to_assigned_seconds_count") == DONE + 1
    assert sched.value("devsched_assigned_to_claimed_seconds_count") == DONE + 1
    assert sched.value("devsched_request_duration_seconds_count", endpoint="tasks-submit") == tasks
    # an attempt a report's reply handed over (`take_next`: queued behind a busy device) is never claimed
    handed = len(agent.lines("attempt taken from a report's reply"))
    assert sched.value("devsched_request_duration_seconds_count", endpoint="host-claim") == DONE + 1 - handed
    assert sched.value("devsched_request_duration_seconds_count", endpoint="tasks-cancel") == 1
    # every reply by endpoint and code: those of the protocol-only host too, its late renewal's 409 among them
    assert sched.value("devsched_requests_total", endpoint="tasks-submit", code="200") == tasks
    assert sched.value("devsched_requests_total", endpoint="tasks-cancel", code="200") == 1
    assert sched.value("devsched_requests_total", endpoint="host-renew", code="409") == 1
    assert sched.value("devsched_requests_total", endpoint="host-report", code="200") == DONE
    codes = {dict(labels)["code"] for name, labels in sched.samples if name == "devsched_requests_total"}
    assert codes <= {"200", "409"}, codes
    assert sched.total("devsched_database_operation_seconds_count", operation="submit") == tasks
    assert sched.total("devsched_database_operation_seconds_count", operation="gauges") >= 2
    published = sched.value("devsched_outbox_published_total") or 0
    assert published >= 4 * DONE, published  # submitted, assigned, dispatched, done for each at least
    assert sched.value("devsched_ready", component="scheduler") == 1
    assert (sched.value("process_cpu_seconds_total") or 0) > 0

    # -- the sweeper
    sweeper = await scrape(ports.sweeper)
    assert sweeper.value("devsched_lease_expirations_total", outcome="failed") == 1
    assert sweeper.value("devsched_lease_expirations_total", outcome="requeued") == 0
    assert sweeper.value("devsched_lease_expirations_total", outcome="cancelled") == 0
    assert sweeper.total("devsched_database_operation_seconds_count", operation="sweep") >= 1
    assert sweeper.value("devsched_ready", component="sweeper") == 1

    # -- the agent
    agent_metrics = await scrape(ports.agent)
    steps = agent_metrics.value("devsched_agent_step_duration_seconds_count", action="noop", status="done")
    assert steps == 2 * (DONE - 1)
    assert agent_metrics.value("devsched_agent_step_duration_seconds_count", action="shell", status="done") == 1
    assert (agent_metrics.value("devsched_agent_step_duration_seconds_sum", action="shell", status="done") or 0) >= 1.5
    assert agent_metrics.value("devsched_agent_spool_reports") == 0
    assert (agent_metrics.value("devsched_agent_renewal_round_trip_seconds_count") or 0) >= 1
    assert agent_metrics.value("devsched_ready", component="agent") == 1

    # -- which build runs, in every process
    build = {"version": version("devsched-service"), "python": platform.python_version()}
    for exposition in (sched, sweeper, agent_metrics):
        assert exposition.value("devsched_build_info", **build) == 1

    # -- no ids as label values
    ids = [*done, cancelled, queued, expired, host.host_id, silent_device, agent.host_id, lab.device("d1")]
    for exposition in (sched.text, sweeper.text, agent_metrics.text):
        leaked = [i for i in ids if i in exposition]
        assert not leaked, leaked
