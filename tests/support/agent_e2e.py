"""Helpers of the agent's end-to-end tests: the real agent, scheduler and sweeper as processes.

`devsched-agent --config agent.toml` runs as a process per test host (`AgentProcess`), the control plane
as the scheduler and sweeper processes of `scheduler_harness` (`Plane`). Faults are done to processes by
pid only (`devsched.embedded.ChildProcess`): SIGSTOP/SIGCONT (`paused()`), SIGKILL, SIGTERM. Everything a
test waits for is a bounded poll.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from nats.aio.client import Client as NatsClient

from devsched.embedded.supervisor import run as supervisor_run
from support.polling import eventually
from support.scheduler_harness import (
    ServiceProcess,
    api,
    call,
    call_retrying,
    scheduler_process,
    service_env,
    sweeper_process,
    task_events,
)

#: Control-plane settings of these tests: heartbeats, sweeps and assignment ticks fast, so that short
#: leases (3-4 s) keep the suite quick. A test that needs a device grace passes its own.
PLANE_SETTINGS: dict[str, Any] = {"heartbeat_interval_s": 0.5, "sweep_interval_s": 0.2, "device_grace_s": 0.0}

#: Agent options of these tests: quick stops, a short request timeout (so a paused scheduler is noticed
#: within a lease of 3-4 s), quick shutdown.
AGENT_OPTIONS: dict[str, float] = {
    "stop_grace_s": 0.5,
    "shutdown_grace_s": 1.0,
    "request_timeout_s": 1.0,
    "drain_timeout_s": 1.0,
}

AGENT_READY = "bound to the assignments consumer"


# -- plans ---------------------------------------------------------------------------------------------


def shell(name: str, command: str, **options: Any) -> dict[str, Any]:
    """A `shell` step (options: `timeout_s`, `interruptible`, `always`)."""
    return {"name": name, "action": "shell", "args": {"command": command}, **options}


def noop(name: str, **options: Any) -> dict[str, Any]:
    """A `noop` step."""
    return {"name": name, "action": "noop", "args": {}, **options}


def touch(path: Path) -> str:
    """A shell command creating the marker file `path`."""
    return f"touch '{path}'"


@dataclass(frozen=True)
class Gate:
    """A file a step waits for: the test decides when the step ends."""

    path: Path

    @property
    def wait(self) -> str:
        """A shell command that returns once the gate is open."""
        return f"while [ ! -e '{self.path}' ]; do sleep 0.05; done"

    def open(self) -> None:
        """Let the waiting step go on."""
        self.path.touch()


# -- logs ----------------------------------------------------------------------------------------------


def matching(lines: list[dict[str, Any]], msg: str, **fields: Any) -> list[dict[str, Any]]:
    """The log lines with this `msg` whose fields have these values (compared as strings)."""
    return [
        line for line in lines if line.get("msg") == msg and all(str(line.get(k)) == str(v) for k, v in fields.items())
    ]


async def wait_line(process: ServiceProcess, msg: str, *, timeout: float = 20.0, **fields: Any) -> dict[str, Any]:  # noqa: ASYNC109
    """Wait for a log line of `process` with this `msg` and these fields; return the first."""

    def found() -> dict[str, Any] | None:
        hits = matching(process.log_lines(), msg, **fields)
        return hits[0] if hits else None

    line = await eventually(found, timeout=timeout, message=f"log line {msg!r} {fields} of {process.module}")
    assert line is not None
    return line


async def wait_expired(
    process: ServiceProcess,
    task_id: object,
    *,
    attempt: int | None = None,
    timeout: float = 20.0,  # noqa: ASYNC109
) -> dict[str, Any]:
    """Wait for the sweeper's `leases expired` line listing this task's lease (`attempt`: that attempt's)."""

    def listed(line: dict[str, Any]) -> bool:
        return any(
            t == str(task_id) and (attempt is None or a == str(attempt))
            for t, _, a in (lease.partition("/") for lease in str(line.get("leases", "")).split())
        )

    def found() -> dict[str, Any] | None:
        hits = [line for line in matching(process.log_lines(), "leases expired") if listed(line)]
        return hits[0] if hits else None

    what = f"the expiry of {task_id}/{attempt or '*'} logged by {process.module}"
    line = await eventually(found, timeout=timeout, message=what)
    assert line is not None
    return line


# -- the control plane -------------------------------------------------------------------------------


@dataclass
class Plane:
    """The scheduler and sweeper processes of one prefix and one database."""

    prefix: str
    database_url: str
    nats_url: str
    env: dict[str, str]
    logs: Path
    scheduler: ServiceProcess
    sweeper: ServiceProcess
    retired: list[ServiceProcess] = field(default_factory=list)

    @classmethod
    def start(cls, database_url: str, nats_url: str, prefix: str, logs: Path, **overrides: Any) -> Plane:
        """Start both processes (call `ready` before use)."""
        env = service_env(database_url, nats_url, prefix, **{**PLANE_SETTINGS, **overrides})
        scheduler = scheduler_process(env, logs / "scheduler-0.log").start()
        sweeper = sweeper_process(env, logs / "sweeper.log").start()
        return cls(prefix, database_url, nats_url, env, logs, scheduler, sweeper)

    async def ready(self) -> None:
        """Wait until the scheduler serves and the sweeper sweeps."""
        await asyncio.gather(self.scheduler.wait_logged("serving"), self.sweeper.wait_logged("sweeping"))

    def start_scheduler(self) -> ServiceProcess:
        """Start a new scheduler process (after the old one was killed); it becomes `scheduler`."""
        assert not self.scheduler.running, "the scheduler still runs"
        self.retired.append(self.scheduler)
        self.scheduler = scheduler_process(self.env, self.logs / f"scheduler-{len(self.retired)}.log").start()
        return self.scheduler

    def scheduler_lines(self, msg: str, **fields: Any) -> list[dict[str, Any]]:
        """Log lines of every scheduler process so far."""
        return [line for p in [*self.retired, self.scheduler] for line in matching(p.log_lines(), msg, **fields)]

    def processes(self) -> list[ServiceProcess]:
        """Every process this plane started."""
        return [*self.retired, self.scheduler, self.sweeper]

    def stop(self) -> None:
        """SIGTERM each process (and SIGCONT, in case a test left one paused); SIGKILL what hangs."""
        for process in self.processes():
            process.stop(timeout=15)


# -- agents --------------------------------------------------------------------------------------------


def _toml(value: Any) -> str:
    """A TOML value for a string, number or flat string table (JSON strings are TOML basic strings)."""
    if isinstance(value, Mapping):
        return "{ " + ", ".join(f"{json.dumps(k)} = {json.dumps(v)}" for k, v in value.items()) + " }"
    if isinstance(value, Path):
        return json.dumps(str(value))
    return json.dumps(value)


class AgentProcess:
    """One host's `devsched-agent --config agent.toml`; each (re)start is a new process with its own log."""

    def __init__(
        self,
        workdir: Path,
        *,
        host_id: str,
        devices: list[dict[str, Any]],
        nats_url: str,
        prefix: str,
        **options: Any,
    ) -> None:
        self.workdir = workdir
        self.host_id = host_id
        self.devices = devices
        self.spool_dir = workdir / "spool"
        self.config_path = workdir / "agent.toml"
        self.runs: list[ServiceProcess] = []
        settings: dict[str, Any] = {
            "host_id": host_id,
            "spool_dir": self.spool_dir,
            "nats_url": nats_url,
            "subject_prefix": prefix,
            **AGENT_OPTIONS,
            **options,
        }
        lines = [f"{key} = {_toml(value)}" for key, value in settings.items()]
        for device in devices:
            lines.append("[[devices]]")
            lines.extend(f"{key} = {_toml(value)}" for key, value in device.items())
        workdir.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text("\n".join(lines) + "\n")

    def start(self, extra_env: Mapping[str, str] | None = None) -> AgentProcess:
        """Start a process of this agent (the config file, hence the spool, is the same every time).

        `extra_env` is added to the process's environment (secrets that steps must not see, overrides).
        """
        env = {k: v for k, v in os.environ.items() if not k.startswith("DEVSCHED_")}  # the file decides
        env["PYTHONUNBUFFERED"] = "1"
        env.update(extra_env or {})
        log = self.workdir / f"agent-{len(self.runs)}.log"
        process = ServiceProcess("devsched.agent.main", env, log, "--config", str(self.config_path))
        self.runs.append(process.start())
        return self

    @property
    def process(self) -> ServiceProcess:
        """The latest process."""
        return self.runs[-1]

    async def ready(self, timeout: float = 30.0) -> AgentProcess:  # noqa: ASYNC109
        """Wait until the latest process is bound to its assignments consumer."""
        await self.process.wait_logged(AGENT_READY, timeout=timeout)
        return self

    def lines(self, msg: str, **fields: Any) -> list[dict[str, Any]]:
        """Log lines of every process of this agent so far."""
        return [line for p in self.runs for line in matching(p.log_lines(), msg, **fields)]

    async def wait_line(self, msg: str, *, timeout: float = 20.0, **fields: Any) -> dict[str, Any]:  # noqa: ASYNC109
        """Wait for a log line of any process of this agent; return the first."""

        def found() -> dict[str, Any] | None:
            hits = self.lines(msg, **fields)
            return hits[0] if hits else None

        line = await eventually(found, timeout=timeout, message=f"agent {self.host_id} logs {msg!r} {fields}")
        assert line is not None
        return line

    def spooled(self) -> list[Path]:
        """Reports waiting in the spool."""
        if not self.spool_dir.is_dir():
            return []
        return sorted(p for p in self.spool_dir.glob("*.json") if not p.name.startswith("."))

    def rejected(self) -> list[Path]:
        """Reports put aside in `spool/rejected/`."""
        return sorted((self.spool_dir / "rejected").glob("*.json"))

    def spooled_report(self, task_id: str, attempt: int) -> dict[str, Any] | None:
        """The spooled report of this attempt, if it is in the spool."""
        path = self.spool_dir / f"{task_id}.{attempt}.json"
        try:
            body = json.loads(path.read_bytes())
        except FileNotFoundError:
            return None
        assert isinstance(body, dict)
        return body

    def stop(self) -> list[int | None]:
        """SIGTERM (and SIGCONT) every process still running, SIGKILL what hangs after 20 s; their exit codes."""
        return [process.stop(timeout=20) for process in self.runs if process.running]

    async def terminate(self, timeout: float = 30.0) -> int | None:  # noqa: ASYNC109
        """SIGTERM the latest process and wait for it to exit (SIGKILL after `timeout`); its exit code."""
        return await asyncio.to_thread(self.process.stop, timeout)

    def spooled_releases(self) -> list[Path]:
        """Releases waiting in the spool."""
        return [p for p in self.spooled() if p.name.endswith(".release.json")]


# -- one test's lab --------------------------------------------------------------------------------------


class AgentLab:
    """One test's corner of a control plane: its own device label, agents, files and tasks."""

    def __init__(self, nc: NatsClient, plane: Plane, workdir: Path) -> None:
        self.nc = nc
        self.plane = plane
        self.prefix = plane.prefix
        self.workdir = workdir
        self.tag = uuid.uuid4().hex[:10]
        self.label = {"lab": self.tag}
        self.agents: list[AgentProcess] = []
        #: How long one try of `task` waits: a test whose database link is slow on purpose raises it.
        self.read_timeout_s = 2.0

    def device(self, name: str) -> str:
        """The unique id of this lab's device `name`."""
        return f"{name}-{self.tag}"

    def path(self, name: str) -> Path:
        """A file of this test (markers, gates, pid files)."""
        return self.workdir / name

    def gate(self, name: str) -> Gate:
        """A gate file of this test."""
        return Gate(self.path(f"gate-{name}"))

    def agent(
        self,
        *device_names: str,
        env: Mapping[str, str] | None = None,
        agent_env: Mapping[str, str] | None = None,
        **options: Any,
    ) -> AgentProcess:
        """Start an agent with these devices (labelled with this lab's label); await `.ready()` next.

        `env` is the devices' env in agent.toml, `agent_env` added to the agent process's own environment.
        """
        host_id = f"h{len(self.agents)}-{self.tag}"
        devices = [
            {"device_id": self.device(name), "labels": self.label, "env": dict(env or {})} for name in device_names
        ]
        agent = AgentProcess(
            self.workdir / host_id,
            host_id=host_id,
            devices=devices,
            nats_url=self.plane.nats_url,
            prefix=self.prefix,
            **options,
        )
        self.agents.append(agent.start(agent_env))
        return agent

    async def submit(self, steps: list[dict[str, Any]], *, timeout: float = 5.0, **fields: Any) -> str:  # noqa: ASYNC109
        """Submit a plan that only this lab's devices match; the task id (`timeout`: of the request)."""
        body = {"selector": {"labels": self.label}, "plan": {"steps": steps}, **fields}
        return str((await call(self.nc, api(self.prefix, "tasks.submit"), body, timeout=timeout))["task_id"])

    async def task(self, task_id: str) -> dict[str, Any]:
        """The task view (retried while a restarting server or scheduler cannot answer)."""
        subject, body = api(self.prefix, "tasks.get"), {"task_id": task_id}
        view: dict[str, Any] = await call_retrying(self.nc, subject, body, timeout=self.read_timeout_s)
        return view

    async def cancel(self, task_id: str, reason: str = "test") -> dict[str, Any]:
        """Request the task's cancellation."""
        reply: dict[str, Any] = await call(
            self.nc, api(self.prefix, "tasks.cancel"), {"task_id": task_id, "reason": reason}
        )
        return reply

    async def cli(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:  # noqa: ASYNC109
        """`devsched ARGS...` (the real CLI, as a process) aimed at this lab's control plane."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("DEVSCHED_")}
        env.update(DEVSCHED_NATS_URL=self.plane.nats_url, DEVSCHED_SUBJECT_PREFIX=self.prefix, COLUMNS="200")
        command = [sys.executable, "-m", "devsched.client", *args]
        return await asyncio.to_thread(supervisor_run, command, env=env, timeout=timeout)

    async def drain(self, name: str, drained: bool = True) -> None:
        """Drain this lab's device `name` (or return it to service)."""
        await call(self.nc, api(self.prefix, "devices.drain"), {"device_id": self.device(name), "drained": drained})

    async def device_state(self, name: str) -> str:
        """The state of this lab's device `name` in `hosts.list`."""
        listed = await call(self.nc, api(self.prefix, "hosts.list"), {})
        device_id = self.device(name)
        return str(next(d["state"] for h in listed["hosts"] for d in h["devices"] if d["device_id"] == device_id))

    async def wait_status(self, task_id: str, *statuses: str, within: float = 20.0) -> dict[str, Any]:
        """Wait until the task is in one of `statuses`; its view."""

        async def reached() -> dict[str, Any] | None:
            view = await self.task(task_id)
            return view if view["status"] in statuses else None

        view = await eventually(reached, timeout=within, message=f"task {task_id} in {statuses}")
        assert isinstance(view, dict)
        return view

    async def wait_view(
        self, task_id: str, predicate: Callable[[dict[str, Any]], bool], *, within: float = 20.0, what: str = "view"
    ) -> dict[str, Any]:
        """Wait until `predicate(view)` holds; the view."""

        async def reached() -> dict[str, Any] | None:
            view = await self.task(task_id)
            return view if predicate(view) else None

        view = await eventually(reached, timeout=within, message=f"task {task_id}: {what}")
        assert isinstance(view, dict)
        return view

    async def events(self, task_id: str) -> list[dict[str, Any]]:
        """The task's events in the events stream."""
        events: list[dict[str, Any]] = await task_events(self.nc.jetstream(), self.prefix, task_id)
        return events

    async def wait_events(self, task_id: str, *kinds: str, within: float = 10.0) -> list[dict[str, Any]]:
        """Wait until the task's events include every one of `kinds`; all its events."""

        async def seen() -> list[dict[str, Any]] | None:
            events = await self.events(task_id)
            names = [e["event"] for e in events]
            return events if all(k in names for k in kinds) else None

        found = await eventually(seen, timeout=within, message=f"events {kinds} of {task_id}")
        assert isinstance(found, list)
        return found

    def stop(self) -> None:
        """Stop every agent of this lab."""
        for agent in self.agents:
            agent.stop()


# -- reading views -------------------------------------------------------------------------------------


def at(timestamp: str) -> datetime:
    """An RFC 3339 timestamp of the protocol as a datetime."""
    return datetime.fromisoformat(timestamp.replace("Z", "+00:00"))


def identity(attempt: Mapping[str, Any]) -> tuple[Any, ...]:
    """What renewals must never change about an attempt."""
    return (
        attempt["attempt"],
        attempt["lease_id"],
        attempt["host_id"],
        attempt["device_id"],
        attempt["assigned_at"],
        attempt["dispatched_at"],
    )


def step_statuses(view: Mapping[str, Any]) -> list[tuple[str, str]]:
    """`(name, status)` of every step in the task's recorded result."""
    return [(s["name"], s["status"]) for s in view["result"]["steps"]]


# -- step users ----------------------------------------------------------------------------------------

#: The unprivileged user that the step-user tests run steps as (created once, idempotently).
STEP_USER = "devsched-step"


def ensure_step_user(name: str = STEP_USER) -> pwd.struct_passwd:
    """The system user `name`, created with `useradd --system --no-create-home` if missing.

    Skips the test unless it runs as root: only root can create the user and switch to it.
    """
    if os.geteuid() != 0:
        pytest.skip("step_user tests need root (to create a user and run steps as it); run them in CI as root")
    try:
        return pwd.getpwnam(name)
    except KeyError:
        pass
    # Exit code 9: created meanwhile by a concurrent test run, which is as good.
    done = subprocess.run(
        ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode not in (0, 9):
        pytest.fail(f"useradd {name} failed ({done.returncode}): {done.stderr.strip()}")
    return pwd.getpwnam(name)


@contextlib.contextmanager
def step_user_dir(user: pwd.struct_passwd) -> Iterator[Path]:
    """A root-owned 0755 directory under the system temp dir, with `marks/` that `user` owns.

    pytest's tmp_path is under a 0700 directory that a step user cannot pass: such tests put the agent's
    `work_dir` here (`<dir>/work`, which the agent creates) and let steps write markers in `<dir>/marks`.
    """
    path = Path(tempfile.mkdtemp(prefix="devsched-step-test-"))
    try:
        os.chmod(path, 0o755)
        marks = path / "marks"
        marks.mkdir(mode=0o755)
        os.chown(marks, user.pw_uid, user.pw_gid)
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
