"""The agent's readiness: ready when it can take work (`/readyz`; `metrics_port` in agent.toml).

| check | passes when |
| --- | --- |
| `nats` | connected, and the server answers a PING |
| `registered` | the scheduler accepted this host's registration (not ready names a device of another host) |
| `consumer` | bound to its assignments consumer, and not draining (a draining agent takes no more work) |
| `reports` | no report is parked: the scheduler did not keep failing on one (`reporter.py`) |

An agent whose scheduler is away keeps retrying its registration: alive (`/healthz`), not ready.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from devsched.service import HealthServer, NotReady, check_nats

if TYPE_CHECKING:
    from devsched.agent.agent import Agent


def add_checks(health: HealthServer, agent: Agent) -> None:
    """Register the checks of the table above on `agent`'s state."""

    async def nats() -> None:
        await check_nats(agent.nc)

    async def registered() -> None:
        if not agent.registered.is_set():
            refused = agent.registration.refused_devices if agent.registration is not None else ()
            if refused:
                raise NotReady(
                    f"device_conflict: device {', '.join(refused)} belongs to another host"
                    " (an operator frees it with `devsched devices forget`)"
                )
            raise NotReady("not registered with the scheduler yet")

    async def consumer() -> None:
        if agent.draining.is_set():
            raise NotReady("draining: taking no more work")
        if not agent.bound.is_set():
            raise NotReady("not bound to the assignments consumer yet")

    async def reports() -> None:
        if agent.parked_reports:
            raise NotReady(
                f"{len(agent.parked_reports)} report(s) parked after the scheduler kept failing on them;"
                " kept in the spool, sent again at the next start"
            )

    for name, check in (("nats", nats), ("registered", registered), ("consumer", consumer), ("reports", reports)):
        health.check(name, check)
