"""The real services as processes, for the client's and the CLI's tests.

`running_stack` starts `python -m devsched.scheduler`, `python -m devsched.sweeper` and one
`devsched-agent` per host (simulated devices labelled `platform=sim`) against a given NATS server,
database and subject prefix, waits until each is ready (by its JSON log lines), and stops them all by
pid afterwards. Shared by the client tests and tests/e2e/cli.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import nats

from devsched.embedded import ChildProcess, supervisor
from support.databases import as_service_role, create_test_database, drop_database, in_thread
from support.scheduler_harness import BUDGETS
from support.scheduler_harness import delete_streams as delete_prefix_streams
from support.servers import NatsHandle, PostgresHandle

#: Fast settings for tests: short ticks, no post-expiry device grace.
FAST_ENV = {
    "DEVSCHED_ASSIGN_TICK_S": "0.2",
    "DEVSCHED_RELAY_TICK_S": "0.2",
    "DEVSCHED_SWEEP_INTERVAL_S": "0.2",
    "DEVSCHED_HEARTBEAT_INTERVAL_S": "2",
    "DEVSCHED_DEVICE_GRACE_S": "0",
    "DEVSCHED_SHUTDOWN_GRACE_S": "3",
    "DEVSCHED_DRAIN_TIMEOUT_S": "2",
    "DEVSCHED_DB_POOL_SIZE": "4",
    # Small storage budgets: each stream reserves its cap from the shared test server's store.
    **{f"DEVSCHED_{name.upper()}": str(value) for name, value in BUDGETS.items()},
}

#: The agent of this workspace's environment.
AGENT_COMMAND = (sys.executable, "-m", "devsched.agent.main")


def service(name: str, argv: list[str], env: Mapping[str, str], log_path: Path) -> ChildProcess:
    """One service process with its log file, started; stopped by pid (20 s after SIGTERM, SIGKILL)."""
    return ChildProcess(name, argv, env, log_path, stop_timeout=20.0).start()


@dataclass
class Stack:
    """Where the running services are, and how to point a client or the CLI at them."""

    nats_url: str
    database_url: str
    prefix: str
    work_dir: Path
    host_id: str
    device_ids: list[str]
    procs: list[ChildProcess] = field(default_factory=list)

    def cli_env(self, **extra: str) -> dict[str, str]:
        """The environment of a `devsched` CLI process aimed at this stack."""
        return clean_env(DEVSCHED_NATS_URL=self.nats_url, DEVSCHED_SUBJECT_PREFIX=self.prefix, COLUMNS="200", **extra)

    def logs(self) -> str:
        """Every process's log tail, for failure messages."""
        return "\n".join(f"--- {p.name} ({p.log_path})\n{p.tail(40)}" for p in self.procs)


def _wait(procs: list[tuple[ChildProcess, str]], timeout: float) -> None:
    """Wait until each process has logged its message, all within `timeout` seconds; fail at once if one exits."""
    deadline = time.monotonic() + timeout
    for proc, msg in procs:
        remaining = max(0.0, deadline - time.monotonic())
        proc.wait_ready(lambda p=proc, m=msg: p.logged(m), timeout=remaining, what=f"{proc.name} ({msg!r})")


def _agent_config(path: Path, host_id: str, device_ids: list[str], nats_url: str, prefix: str) -> None:
    lines = [
        f'host_id = "{host_id}"',
        f"spool_dir = {json.dumps(str(path.parent / (host_id + '-spool')))}",
        f'nats_url = "{nats_url}"',
        f'subject_prefix = "{prefix}"',
        "stop_grace_s = 1.0",
        "shutdown_grace_s = 2.0",
    ]
    for device_id in device_ids:
        lines += ["[[devices]]", f'device_id = "{device_id}"', 'labels = { platform = "sim" }', ""]
    path.write_text("\n".join(lines) + "\n")


@contextlib.contextmanager
def running_stack(
    nats_url: str,
    database_url: str,
    prefix: str,
    work_dir: Path,
    *,
    devices: int = 2,
    agent_command: Sequence[str] = AGENT_COMMAND,
) -> Iterator[Stack]:
    """Scheduler, sweeper and one agent (with `devices` devices) as processes, until the block ends.

    The agent runs as `agent_command --config FILE` (another installation's `devsched-agent`, say).
    """
    host_id = f"{prefix}-h1"
    device_ids = [f"{prefix}-d{i}" for i in range(1, devices + 1)]
    stack = Stack(nats_url, database_url, prefix, work_dir, host_id, device_ids)
    env = {k: v for k, v in os.environ.items() if not k.startswith("DEVSCHED_")}
    env.update(FAST_ENV)
    env.update(DEVSCHED_NATS_URL=nats_url, DEVSCHED_DATABASE_URL=database_url, DEVSCHED_SUBJECT_PREFIX=prefix)
    env["PYTHONUNBUFFERED"] = "1"
    config = work_dir / f"{host_id}.toml"
    _agent_config(config, host_id, device_ids, nats_url, prefix)
    try:
        # each service as its own database role, as deployed (devsched.store.roles)
        scheduler = service(
            "scheduler", [sys.executable, "-m", "devsched.scheduler"], as_service_role(env, "scheduler"),
            work_dir / "scheduler.log",
        )  # fmt: skip
        stack.procs.append(scheduler)
        sweeper = service(
            "sweeper", [sys.executable, "-m", "devsched.sweeper"], as_service_role(env, "sweeper"),
            work_dir / "sweeper.log",
        )  # fmt: skip
        stack.procs.append(sweeper)
        _wait([(scheduler, "serving"), (sweeper, "sweeping")], timeout=60)
        agent_env = {k: v for k, v in env.items() if k != "DEVSCHED_DATABASE_URL"}
        agent = service(
            "agent", [*agent_command, "--config", str(config)], agent_env,
            work_dir / "agent.log",
        )  # fmt: skip
        stack.procs.append(agent)
        _wait([(agent, "bound to the assignments consumer")], timeout=60)
        yield stack
    finally:
        for proc in reversed(stack.procs):  # the agent first: it reports while the scheduler still serves
            proc.stop()


def delete_streams(nats_url: str, prefix: str) -> None:
    """Remove the prefix's streams from the shared test server (from any thread without a loop)."""

    async def run() -> None:
        nc = await nats.connect(nats_url, connect_timeout=2)
        try:
            await delete_prefix_streams(nc, prefix)
        finally:
            await nc.close()

    asyncio.run(run())


@contextlib.contextmanager
def stack_for_tests(
    nats_server: NatsHandle,
    postgres_server: PostgresHandle,
    template: str,
    work_dir: Path,
    *,
    agent_command: Sequence[str] = AGENT_COMMAND,
) -> Iterator[Stack]:
    """`running_stack` on a fresh database cloned from `template` and a fresh prefix; both removed after."""
    name = create_test_database(postgres_server.dsn(), template)
    prefix = f"c{uuid.uuid4().hex[:10]}"
    try:
        with running_stack(
            nats_server.url, postgres_server.url(name), prefix, work_dir, agent_command=agent_command
        ) as stack:
            yield stack
    finally:
        in_thread(lambda: delete_streams(nats_server.url, prefix))
        drop_database(postgres_server.dsn(), name)


#: `devsched ARGS...` run as a process.
Devsched = Callable[..., subprocess.CompletedProcess[str]]


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without any DEVSCHED_* variable, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DEVSCHED_")}
    env.update(extra)
    return env


def up_process(argv: list[str], cwd: Path, out_path: Path, **env: str) -> ChildProcess:
    """`devsched up` (the whole `argv`) as a started process, its output in `out_path`, without DEVSCHED_*
    variables (plus `env`); if the test run dies, the kernel SIGTERMs it and it stops its children.

    Its XDG state dir (the dashboard token) is `cwd/state` unless `env` says otherwise: never the user's.
    """
    env.setdefault("XDG_STATE_HOME", str(cwd / "state"))
    return ChildProcess(
        "devsched up", argv, clean_env(COLUMNS="200", **env), out_path, cwd=cwd, death_signal=signal.SIGTERM
    ).start()


def run_devsched(
    *args: str, env: Mapping[str, str] | None = None, cwd: Path | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """`devsched ARGS...` as a process (`python -m devsched.client`), its output captured as text.

    The environment defaults to this process's without DEVSCHED_* variables. It dies with the test run.
    """
    return supervisor.run(
        [sys.executable, "-m", "devsched.client", *args],
        env=dict(env) if env is not None else clean_env(COLUMNS="200"), cwd=cwd, timeout=timeout,
    )  # fmt: skip
