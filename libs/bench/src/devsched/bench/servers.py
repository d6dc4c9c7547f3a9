"""The bench's system: durable embedded servers, the devsched database, and the services as processes.

Everything durable, as a deployment runs it and unlike the test harness: Postgres with `fsync`,
`synchronous_commit` and `full_page_writes` on, its data on disk (never /dev/shm); nats-server with its
JetStream store on disk and, by default, `sync_interval: always` (each write fsync'd, as production
should configure it). pg_stat_statements is preloaded, so every phase can say which statements it ran.
The scheduler, the sweeper and the agents are the real programs (`python -m ...`), each connected to
Postgres as its own role, like `devsched up` runs them.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path

from devsched.devstack.layout import Layout, SimDevice, SimHost
from devsched.devstack.processes import Child, python_module, stop_all
from devsched.devstack.stack import ensure_database
from devsched.embedded import NatsServer, PostgresServer
from devsched.embedded.postgres_server import DURABLE_SETTINGS
from devsched.store.roles import DatabaseRoles, role_url

#: Subject prefix of the bench's deployment.
PREFIX = "devsched"
#: The devsched database, and the databases of the floors and of the Procrastinate peer.
DATABASE = "devsched"
FLOOR_DATABASE = "bench_floor"
PEER_DATABASE = "bench_peer"

#: Durable Postgres, as a deployment runs it, with the statistics the profiles read.
BENCH_SETTINGS: Mapping[str, str] = {
    **DURABLE_SETTINGS,
    "shared_preload_libraries": "pg_stat_statements",
    "pg_stat_statements.max": "5000",
    "pg_stat_statements.track": "top",
}

#: The scheduler's settings for the saturation phases (renewals, sweep and after), on top of its defaults:
#: the per-host fair share is lifted, since 8 requesters per host renewing as fast as they can is a
#: saturation test, not a misbehaving host. The lifecycle and the latency run at the defaults, as users do.
LIFTED_SHARE: Mapping[str, str] = {
    "DEVSCHED_HOST_RATE_PER_S": "1000000",
    "DEVSCHED_HOST_BURST": "100000",
}


class BenchStack:
    """The servers and services of one bench run: `start()` (blocking, main thread), then `stop()`.

    Args:
        data_dir: Home of the servers' data and the services' logs (see `fresh_data_dir`).
        sync_always: JetStream's `sync_interval: always`.
        scheduler_env: Extra DEVSCHED_* settings of the scheduler.
    """

    def __init__(self, data_dir: Path, *, sync_always: bool, scheduler_env: Mapping[str, str] | None = None) -> None:
        self.data_dir = data_dir.absolute()
        self.layout = Layout(self.data_dir)
        self.roles = DatabaseRoles()
        self.nats = NatsServer(self.layout.nats_dir, sync_always=sync_always)
        self.postgres = PostgresServer(self.layout.postgres_dir, settings=BENCH_SETTINGS)
        self.scheduler_env = dict(scheduler_env or {})
        #: Whether the scheduler runs with `LIFTED_SHARE` (`lift_fair_share`).
        self.lifted = False
        self.scheduler: Child | None = None
        self.sweeper: Child | None = None
        self.agents: dict[str, Child] = {}

    @staticmethod
    def fresh_data_dir() -> Path:
        """A new directory under /var/tmp (on disk, where /tmp may be a tmpfs), open to the Postgres account.

        Mode 0755: as root, Postgres runs as its own account, which must reach its data directory inside.
        """
        base = Path("/var/tmp") if Path("/var/tmp").is_dir() else Path(tempfile.gettempdir())
        path = Path(tempfile.mkdtemp(prefix="devsched-bench-", dir=base))
        path.chmod(0o755)
        return path

    # -- servers (synchronous: the main thread, so a server dies with us) -------------------------------

    def start_servers(self) -> None:
        """Start NATS and Postgres, create the roles and databases, migrate devsched's."""
        self.layout.create()
        self.nats.start()
        self.postgres.start()
        asyncio.run(self._prepare_databases())
        from devsched.store.migrations import upgrade  # alembic is slow to import

        upgrade(role_url(self.postgres.url(DATABASE), self.roles.owner), roles=self.roles)

    async def _prepare_databases(self) -> None:
        import asyncpg  # type: ignore[import-untyped]

        await ensure_database(self.postgres.dsn(), DATABASE, self.roles)
        conn = await asyncpg.connect(self.postgres.dsn(), timeout=15)
        try:
            await conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            for name in (FLOOR_DATABASE, PEER_DATABASE):
                if not await conn.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", name):
                    await conn.execute(f'CREATE DATABASE "{name}"')
        finally:
            await conn.close()

    def stop(self) -> None:
        """Stop every process this run started: agents, services, then the servers."""
        stop_all(list(self.agents.values()), timeout=15.0)
        stop_all([c for c in (self.sweeper, self.scheduler) if c is not None], timeout=20.0)
        for server in (self.postgres, self.nats):
            with contextlib.suppress(Exception):
                server.stop()

    # -- addresses --------------------------------------------------------------------------------------

    @property
    def nats_url(self) -> str:
        """The embedded NATS."""
        return self.nats.url

    def admin_dsn(self, database: str = "postgres") -> str:
        """asyncpg/libpq DSN of `database` as the superuser."""
        return self.postgres.dsn(database)

    def service_url(self, service: str) -> str:
        """The SQLAlchemy URL a service connects with (its own role)."""
        return role_url(self.postgres.url(DATABASE), self.roles.service(service))

    def pids(self) -> dict[str, int | None]:
        """The process trees whose CPU the bench counts."""
        out: dict[str, int | None] = {
            "scheduler": None if self.scheduler is None else self.scheduler.pid,
            "sweeper": None if self.sweeper is None else self.sweeper.pid,
            "postgres": self.postgres.pid,
            "nats": self.nats.pid,
        }
        for name, agent in self.agents.items():
            out[f"agent {name}"] = agent.pid
        return out

    # -- services ---------------------------------------------------------------------------------------

    def _env(self, extra: Mapping[str, str]) -> dict[str, str]:
        # DEVSCHED_EVENT_LOOP passes (as in `devsched up`): the loop is the process's, not a setting of the run.
        env = {k: v for k, v in os.environ.items() if not k.startswith("DEVSCHED_") or k == "DEVSCHED_EVENT_LOOP"}
        env.update(
            {
                "DEVSCHED_NATS_URL": self.nats_url,
                "DEVSCHED_SUBJECT_PREFIX": PREFIX,
                "DEVSCHED_LOG_LEVEL": "INFO",
                "PYTHONUNBUFFERED": "1",
                **extra,
            }
        )
        return env

    def start_scheduler(self) -> Child:
        """Start (or restart) the scheduler process."""
        if self.scheduler is not None:
            stop_all([self.scheduler], timeout=20.0)
        env = self._env({"DEVSCHED_DATABASE_URL": self.service_url("scheduler"), **self.scheduler_env})
        self.scheduler = Child(
            "scheduler", python_module("devsched.scheduler"), env, self.layout.logs_dir / "scheduler.log"
        )
        self.scheduler.start()
        return self.scheduler

    def lift_fair_share(self) -> Child:
        """Restart the scheduler with the per-host fair share lifted (`LIFTED_SHARE`), for the saturation phases."""
        self.scheduler_env = {**LIFTED_SHARE, **self.scheduler_env}
        self.lifted = True
        return self.start_scheduler()

    def start_sweeper(self) -> Child:
        """Start the sweeper process."""
        env = self._env({"DEVSCHED_DATABASE_URL": self.service_url("sweeper")})
        self.sweeper = Child("sweeper", python_module("devsched.sweeper"), env, self.layout.logs_dir / "sweeper.log")
        self.sweeper.start()
        return self.sweeper

    def start_agent(self, host_id: str, devices: int, labels: Mapping[str, str]) -> Child:
        """Start a real `devsched-agent` for `host_id` with `devices` devices carrying `labels`."""
        host = SimHost(
            host_id,
            "bench",
            tuple(SimDevice(f"{host_id}-d{d}", dict(labels)) for d in range(1, devices + 1)),
        )
        config = self.layout.write_agent_config(host, nats_url=self.nats_url, prefix=PREFIX, creds=None)
        argv = python_module("devsched.agent.main", "--config", str(config), "--log-level", "INFO")
        agent = Child(f"agent {host_id}", argv, self._env({}), self.layout.logs_dir / f"agent-{host_id}.log")
        agent.start()
        self.agents[host_id] = agent
        return agent

    def stop_agent(self, host_id: str) -> None:
        """SIGTERM the agent of `host_id` and wait for it (SIGKILL after 15 s)."""
        agent = self.agents.pop(host_id, None)
        if agent is not None:
            stop_all([agent], timeout=15.0)

    def check_running(self) -> None:
        """Raise if a service died: the figures of a run without it would mean nothing.

        Raises:
            RuntimeError: naming the service and the end of its log.
        """
        children: list[Child | None] = [self.scheduler, self.sweeper, *self.agents.values()]
        for child in children:
            if child is not None and not child.running:
                raise RuntimeError(f"{child.name} exited with code {child.exit_code}:\n{child.tail()}")
