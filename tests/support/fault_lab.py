"""The fault suite's lab: its own control plane, real agents, a step journal and the invariant checker.

Every scenario of `tests/chaos/test_fault_*.py` runs in one: the scheduler and sweeper are processes of its
own (free to pause, kill, or point through a proxy), agents are real `devsched-agent` processes whose steps
write the journal, and every acknowledged submit is recorded for the checker, which the scenario runs last.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

from nats.aio.client import Client as NatsClient
from sqlalchemy.engine import make_url

from support.agent_e2e import AgentLab, AgentProcess, Plane, service_env
from support.invariants import Invariants
from support.scheduler_harness import ServiceProcess, scheduler_process, sweeper_process
from support.step_journal import StepJournal

#: Control-plane settings of the suite. The device grace is left to its default (the expired attempt's ttl):
#: the checker asserts that no two attempts' steps overlap on a device, which that grace is there to ensure.
FAULT_PLANE: dict[str, Any] = {
    "heartbeat_interval_s": 0.5,
    "sweep_interval_s": 0.2,
    "device_grace_s": None,
    "assign_tick_s": 0.2,
    "relay_tick_s": 0.2,
    # The resync as deployed (its default age): the checker counts its copies in the assignments stream.
    "resync_after_s": None,
}

#: `DEVSCHED_FAULT_POINT`: the named point at which a service process SIGKILLs itself (devsched.store.faults).
FAULT_POINT = "DEVSCHED_FAULT_POINT"


def with_port(url: str, port: int) -> str:
    """`url` (SQLAlchemy) with its port replaced: how services are pointed at a proxy in front of Postgres."""
    return make_url(url).set(port=port).render_as_string(hide_password=False)


class FaultLab(AgentLab):
    """An `AgentLab` with a step journal and an invariant checker; `submit` records acknowledged tasks."""

    def __init__(self, nc: NatsClient, plane: Plane, workdir: Path, checker_url: str) -> None:
        super().__init__(nc, plane, workdir)
        self.journal = StepJournal(workdir / "journal")
        self.inv = Invariants(checker_url, plane.prefix, nc=nc, journal=self.journal, resends=self.resends)

    def resends(self) -> tuple[int, int]:
        """`(acknowledged, sent but unacknowledged)` copies of assignments the resync published, by the logs."""
        acked = len(self.plane.scheduler_lines("assignment resent"))
        return acked, len(self.plane.scheduler_lines("assignment not resent", sent=True))

    async def submit(self, steps: list[dict[str, Any]], *, timeout: float = 5.0, **fields: Any) -> str:  # noqa: ASYNC109
        """Submit (see `AgentLab.submit`); the task counts as acknowledged once the reply came."""
        return self.inv.acknowledge(await super().submit(steps, timeout=timeout, **fields))

    def agent(
        self,
        *device_names: str,
        env: Mapping[str, str] | None = None,
        agent_env: Mapping[str, str] | None = None,
        nats_url: str | None = None,
        **options: Any,
    ) -> AgentProcess:
        """Start an agent (see `AgentLab.agent`), connected to `nats_url` (a proxy, a cluster) if given."""
        host_id = f"h{len(self.agents)}-{self.tag}"
        devices = [
            {"device_id": self.device(name), "labels": self.label, "env": dict(env or {})} for name in device_names
        ]
        agent = AgentProcess(
            self.workdir / host_id,
            host_id=host_id,
            devices=devices,
            nats_url=nats_url or self.plane.nats_url,
            prefix=self.prefix,
            **options,
        )
        self.agents.append(agent.start(agent_env))
        return agent

    async def run_all(self, tasks: list[str], *statuses: str, within: float = 40.0) -> dict[str, dict[str, Any]]:
        """Wait until every task is in one of `statuses` (terminal by default); their views."""
        wanted = statuses or ("done", "failed", "cancelled")
        views = await asyncio.gather(*(self.wait_status(t, *wanted, within=within) for t in tasks))
        return dict(zip(tasks, views, strict=True))


#: Make a fault lab (the chaos suite's `make_lab`): `await make_lab(database=..., nats=..., env=..., **settings)`.
MakeLab = Callable[..., Awaitable[FaultLab]]


def start_plane(
    database_url: str, nats_url: str, prefix: str, logs: Path, *, env: Mapping[str, str] | None = None, **settings: Any
) -> Plane:
    """A scheduler and sweeper with the suite's settings (`settings` override them); `env` is added to both."""
    logs.mkdir(parents=True, exist_ok=True)
    # None leaves a setting to the service's default (service_env drops it)
    plane_env = service_env(database_url, nats_url, prefix, **{**FAULT_PLANE, **settings})
    plane_env.update(env or {})
    scheduler = scheduler_process(plane_env, logs / "scheduler-0.log").start()
    sweeper = sweeper_process(plane_env, logs / "sweeper.log").start()
    return Plane(prefix, database_url, nats_url, plane_env, logs, scheduler, sweeper)


def extra_service(plane: Plane, kind: str, *, env: Mapping[str, str | None] | None = None) -> ServiceProcess:
    """Start another scheduler or sweeper process of `plane`, its environment changed by `env` (None removes)."""
    changed: dict[str, str | None] = {**plane.env, **(env or {})}
    process_env = {k: v for k, v in changed.items() if v is not None}
    make = scheduler_process if kind == "scheduler" else sweeper_process
    count = len(plane.retired) + 1
    process = make(process_env, plane.logs / f"{kind}-extra-{count}-{os.getpid()}.log").start()
    plane.retired.append(process)
    return process
