"""The real scheduler process behind a nats-server with the deploy accounts, and the parties as deployed.

Each host speaks through its own host account (`account_host`: its own subjects, its inbox prefix, its
JetStream API mapping), submitters and operators through the `operator` user, the dashboard through `web`.
The scheduler runs as the `scheduler` user, answering hosts under the server's `_R_.` replies.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nats
from nats.aio.client import Client as NatsClient

from support.scheduler_harness import ServiceProcess, TestHost, scheduler_process, service_env
from support.secured_nats import PREFIX, SCHEDULER_SETTINGS, HostConnection, SecuredNats, account_host


@dataclass
class DeployLab:
    """The running scheduler, the operator's connection, and each host connected so far."""

    server: SecuredNats
    scheduler: ServiceProcess
    operator: NatsClient
    prefix: str = PREFIX
    connections: dict[str, HostConnection] = field(default_factory=dict)
    _hosts: list[TestHost] = field(default_factory=list)
    _clients: list[NatsClient] = field(default_factory=list)

    async def host(self, host_id: str) -> TestHost:
        """A protocol-only host connected through its own account (`connections[host_id]` holds the server's
        refusals of what it sent)."""
        host, connection = await account_host(self.server, host_id)
        self.connections[host_id] = connection
        self._hosts.append(host)
        return host

    async def connect(self, role: str) -> NatsClient:
        """Another connection as a user of the deploy (`web`, `scheduler`, `operator`), closed at the end."""
        client = await nats.connect(self.server.url(role), connect_timeout=2)
        self._clients.append(client)
        return client

    def violations(self, host_id: str) -> list[str]:
        """What the server refused of what this host sent."""
        return self.connections[host_id].violations

    async def close(self) -> None:
        """Unbind the hosts, close every connection."""
        for host in self._hosts:
            await host.close()
        for connection in self.connections.values():
            if connection.nc is not None:
                with contextlib.suppress(Exception):
                    await connection.nc.close()
        for client in [*self._clients, self.operator]:
            with contextlib.suppress(Exception):
                await client.close()


@contextlib.asynccontextmanager
async def deploy_lab(
    server: SecuredNats, database_url: str, log_path: Path, **settings: Any
) -> AsyncIterator[DeployLab]:
    """Start the scheduler (with `settings` over the test defaults) as the deploy's `scheduler` user, wait until it
    serves, connect the operator; stop it all (the scheduler by its pid) after the block."""
    env = service_env(database_url, server.url("scheduler"), PREFIX, **SCHEDULER_SETTINGS, **settings)
    scheduler = scheduler_process(env, log_path).start()
    lab: DeployLab | None = None
    try:
        await scheduler.wait_logged("serving")
        lab = DeployLab(server, scheduler, await nats.connect(server.url("operator"), connect_timeout=2))
        yield lab
    finally:
        if lab is not None:
            await lab.close()
        scheduler.kill()
