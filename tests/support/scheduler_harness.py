"""Test harness for the control plane: raw protocol calls, a test host, and the services as processes.

The test host speaks only the wire protocol (JSON over NATS subjects, the JetStream consumer), the way
an agent of another version or an operator with the `nats` CLI would; it uses no devsched package.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nats
import nats.errors
import nats.js.api
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.js import JetStreamContext

from devsched.embedded import ChildProcess
from devsched.scheduler.app import Scheduler
from devsched.scheduler.settings import SchedulerSettings
from devsched.sweeper.app import Sweeper, SweeperSettings
from support.databases import as_service_role, service_url
from support.polling import eventually

ERROR_CODE_HEADER = "Nats-Service-Error-Code"


class ErrorReply(Exception):
    """An error reply: `status` (the header's number), `code`, `message`, `details`, and the headers."""

    def __init__(self, status: int, body: Mapping[str, Any], headers: Mapping[str, str]) -> None:
        error = body.get("error", {})
        self.status = status
        self.code: str = error.get("code", "")
        self.message: str = error.get("message", "")
        self.details: dict[str, Any] = error.get("details", {})
        self.headers = dict(headers)
        super().__init__(f"{status} {self.code}: {self.message}")


def host_inbox(subject: str) -> str | None:
    """The reply inbox a host's request to `subject` uses (`_INBOX.<host_id>.<unique>`), or None when
    `subject` is not a host subject `P.host.<host_id>.<verb>`.

    The scheduler answers a host only under the host's own inbox, as the real agent connects with the
    inbox prefix `_INBOX.<host_id>`.
    """
    parts = subject.split(".")
    if len(parts) != 4 or parts[1] != "host":
        return None
    return f"_INBOX.{parts[2]}.{uuid.uuid4().hex}"


async def request_with_reply(
    nc: NatsClient,
    subject: str,
    data: bytes,
    reply: str,
    *,
    timeout: float = 5.0,  # noqa: ASYNC109
) -> Msg:
    """A request whose reply subject is `reply` (subscribed to before the publish)."""
    sub = await nc.subscribe(reply, max_msgs=1)
    try:
        await nc.publish(subject, data, reply=reply)
        try:
            msg = await sub.next_msg(timeout=timeout)
        except nats.errors.TimeoutError:
            raise nats.errors.TimeoutError from None
        # the server's "no responders" status message, which nc.request turns into this error
        if msg.headers and msg.headers.get(nats.js.api.Header.STATUS) == "503" and not msg.data:
            raise nats.errors.NoRespondersError
        return msg
    finally:
        with contextlib.suppress(Exception):
            await sub.unsubscribe()


async def raw_request(nc: NatsClient, subject: str, data: bytes, *, timeout: float = 5.0) -> Msg:  # noqa: ASYNC109
    """Send bytes, return the reply message as is (nats-py raises nothing for error replies).

    A host subject is asked from the host's own inbox (`host_inbox`), as the agent does.
    """
    inbox = host_inbox(subject)
    if inbox is None:
        return await nc.request(subject, data, timeout=timeout)
    return await request_with_reply(nc, subject, data, inbox, timeout=timeout)


def check(msg: Msg) -> dict[str, Any]:
    """The reply body as a dict; an error reply raises `ErrorReply`."""
    body = json.loads(msg.data) if msg.data else {}
    if msg.headers and ERROR_CODE_HEADER in msg.headers:
        raise ErrorReply(int(msg.headers[ERROR_CODE_HEADER]), body, msg.headers)
    assert isinstance(body, dict)
    return body


async def call(
    nc: NatsClient,
    subject: str,
    payload: Mapping[str, Any] | None = None,
    *,
    timeout: float = 5.0,  # noqa: ASYNC109
) -> dict[str, Any]:
    """Send a JSON object and return the JSON reply (raise `ErrorReply` for an error reply)."""
    return check(await raw_request(nc, subject, json.dumps(dict(payload or {})).encode(), timeout=timeout))


async def call_retrying(
    nc: NatsClient,
    subject: str,
    payload: Mapping[str, Any] | None = None,
    *,
    deadline_s: float = 20.0,
    timeout: float = 2.0,  # noqa: ASYNC109
) -> dict[str, Any]:
    """`call`, repeated on no-responders, timeouts and 503 until `deadline_s` (for restarts in chaos tests).

    `timeout` bounds each try: raise it where one answer legitimately takes longer (a slow database link).
    """
    deadline = time.monotonic() + deadline_s
    while True:
        try:
            return await call(nc, subject, payload, timeout=timeout)
        except (nats.errors.NoRespondersError, nats.errors.TimeoutError):
            pass
        except ErrorReply as err:
            if err.status != 503:
                raise
        if time.monotonic() > deadline:
            raise AssertionError(f"no successful reply from {subject} within {deadline_s}s")
        await asyncio.sleep(0.1)


def plan(*steps: str) -> dict[str, Any]:
    """A plan of `noop` steps with these names (one step `run` by default)."""
    return {"steps": [{"name": s, "action": "noop", "args": {}} for s in (steps or ("run",))]}


def progress_of(plan_body: Mapping[str, Any], index: int) -> dict[str, Any]:
    """The `progress` object of step `index` of `plan_body`."""
    steps = plan_body["steps"]
    return {"step": steps[index]["name"], "index": index, "of": len(steps)}


def done_result(plan_body: Mapping[str, Any], status: str = "done") -> dict[str, Any]:
    """A `result` with every step of the plan in `status`."""
    return {"steps": [{"name": s["name"], "status": status} for s in plan_body["steps"]]}


@dataclass
class Assigned:
    """One assignment message as the host received it."""

    body: dict[str, Any]
    msg: Msg
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def task_id(self) -> str:
        """The task."""
        return str(self.body["task_id"])

    @property
    def lease(self) -> dict[str, Any]:
        """`{task_id, attempt, lease_id}` to name in claim, renew and report."""
        return {"task_id": self.body["task_id"], "attempt": self.body["attempt"], "lease_id": self.body["lease_id"]}


class TestHost:
    """A host that speaks only the protocol: register, bind its consumer, claim, renew, report."""

    __test__ = False  # not a test class, despite the name

    def __init__(self, nc: NatsClient, prefix: str, host_id: str | None = None) -> None:
        self.nc = nc
        self.prefix = prefix
        self.host_id = host_id or f"h-{uuid.uuid4().hex[:8]}"
        self.js: JetStreamContext = nc.jetstream()
        self._sub: JetStreamContext.PullSubscription | None = None

    def subject(self, verb: str) -> str:
        """`P.host.<id>.<verb>`."""
        return f"{self.prefix}.host.{self.host_id}.{verb}"

    async def request(self, verb: str, payload: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """One host request; error replies raise `ErrorReply`."""
        return await call(self.nc, self.subject(verb), payload)

    async def register(self, *devices: str | tuple[str, Mapping[str, str]], bind: bool = True) -> dict[str, Any]:
        """Register these devices (ids, or (id, labels)); then bind the host's consumer."""
        listed = [
            {"device_id": d, "labels": {}} if isinstance(d, str) else {"device_id": d[0], "labels": dict(d[1])}
            for d in devices
        ]
        reply = await self.request("register", {"devices": listed, "agent_version": "test-host"})
        if bind and self._sub is None:
            self._sub = await self.js.pull_subscribe_bind(
                durable=f"host-{self.host_id}", stream=f"{self.prefix.upper().replace('-', '_')}_ASSIGNMENTS"
            )
        return reply

    async def next_assignment(self, timeout: float = 10.0, *, ack: bool = True) -> Assigned:  # noqa: ASYNC109
        """The next assignment message (acked unless `ack` is false)."""
        assert self._sub is not None, "register first"
        deadline = time.monotonic() + timeout
        while True:
            try:
                msgs = await self._sub.fetch(1, timeout=min(1.0, max(0.05, deadline - time.monotonic())))
            except nats.errors.TimeoutError:
                if time.monotonic() >= deadline:
                    raise AssertionError(f"no assignment for {self.host_id} within {timeout}s") from None
                continue
            msg = msgs[0]
            if ack:
                await msg.ack()
            return Assigned(json.loads(msg.data), msg, dict(msg.headers or {}))

    async def assignments(self, count: int, timeout: float = 10.0) -> list[Assigned]:  # noqa: ASYNC109
        """The next `count` assignments, acked."""
        return [await self.next_assignment(timeout) for _ in range(count)]

    async def no_assignment(self, wait: float = 0.5) -> bool:
        """True when no assignment arrives within `wait` seconds."""
        assert self._sub is not None
        try:
            await self._sub.fetch(1, timeout=wait)
        except nats.errors.TimeoutError:
            return True
        return False

    async def claim(self, a: Assigned) -> dict[str, Any]:
        """Claim the attempt of `a`."""
        return await self.request("claim", a.lease)

    async def renew(self, a: Assigned, progress: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Renew the lease of `a`, with `progress` if given."""
        body = dict(a.lease)
        if progress is not None:
            body["progress"] = dict(progress)
        return await self.request("renew", body)

    async def report(
        self, a: Assigned, outcome: str = "done", *, reason: str | None = None, result: Mapping[str, Any] | None = None
    ) -> dict[str, Any]:
        """Report the outcome of `a` (with every step done, by default)."""
        body = {**a.lease, "outcome": outcome, "reason": reason}
        body["result"] = dict(result) if result is not None else done_result(a.body["plan"])
        return await self.request("report", body)

    async def release(
        self, a: Assigned, *, reason: str | None = None, result: Mapping[str, Any] | None = None
    ) -> dict[str, Any]:
        """Give the attempt of `a` back (`P.host.<id>.release`)."""
        body = {**a.lease, "reason": reason, "result": dict(result) if result is not None else None}
        return await self.request("release", body)

    async def close(self) -> None:
        """Unsubscribe the consumer binding."""
        if self._sub is not None:
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()
            self._sub = None


def api(prefix: str, verb: str) -> str:
    """`P.api.<verb>`, e.g. `api(p, "tasks.submit")`."""
    return f"{prefix}.api.{verb}"


async def submit(nc: NatsClient, prefix: str, **fields: Any) -> str:
    """Submit a task (a one-step noop plan unless given) and return its id."""
    body = {"plan": plan(), **fields}
    return str((await call(nc, api(prefix, "tasks.submit"), body))["task_id"])


async def get_task(nc: NatsClient, prefix: str, task_id: str) -> dict[str, Any]:
    """The task view."""
    return await call(nc, api(prefix, "tasks.get"), {"task_id": task_id})


async def status_of(nc: NatsClient, prefix: str, task_id: str, *statuses: str, within: float = 10.0) -> dict[str, Any]:
    """Wait until the task is in one of `statuses`; return its view."""

    async def reached() -> dict[str, Any] | None:
        view = await get_task(nc, prefix, task_id)
        return view if view["status"] in statuses else None

    found = await eventually(reached, timeout=within, message=f"task {task_id} {statuses}")
    assert found is not None
    return dict(found)


async def device_state(nc: NatsClient, prefix: str, device_id: str) -> str:
    listed = await call(nc, api(prefix, "hosts.list"), {})
    return str(next(d["state"] for h in listed["hosts"] for d in h["devices"] if d["device_id"] == device_id))


async def stream_messages(js: JetStreamContext, stream: str, subject: str | None = None) -> list[Msg]:
    """Every message of `stream` (optionally one subject), read with an ordered ephemeral consumer."""
    info = await js.stream_info(stream)
    total = info.state.messages
    if total == 0:
        return []
    sub = await js.subscribe(subject or ">", stream=stream, ordered_consumer=True)
    out: list[Msg] = []
    try:
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline:
            try:
                msg = await sub.next_msg(timeout=0.5)
            except nats.errors.TimeoutError:
                break
            out.append(msg)
            if msg.metadata.num_pending == 0:
                break
    finally:
        await sub.unsubscribe()
    return out


async def task_events(js: JetStreamContext, prefix: str, task_id: str) -> list[dict[str, Any]]:
    """The events of one task in the events stream, in stream order."""
    stream = f"{prefix.upper().replace('-', '_')}_EVENTS"
    return [json.loads(m.data) for m in await stream_messages(js, stream, f"{prefix}.events.task.{task_id}")]


async def delete_streams(nc: NatsClient, prefix: str) -> None:
    """Remove the test's streams (they would otherwise pile up on the session's server)."""
    js = nc.jetstream()
    pu = prefix.upper().replace("-", "_")
    names = [f"{pu}_{suffix}" for suffix in ("ASSIGNMENTS", "EVENTS", "LOGS", "UPLOADS")]
    with contextlib.suppress(Exception):  # each host's logs and uploads streams
        names += [
            name
            for info in await js.streams_info()
            if (name := info.config.name or "").startswith((f"{pu}_LOGS_", f"{pu}_UPLOADS_"))
        ]
    for name in names:
        with contextlib.suppress(Exception):
            await js.delete_stream(name)
    for bucket_stream in (f"OBJ_{pu}_ARTIFACTS", f"KV_{pu}_WEB_REVOKED"):
        with contextlib.suppress(Exception):
            await js.delete_stream(bucket_stream)


async def delete_streams_at(url: str, prefix: str) -> None:
    """`delete_streams` on a connection of its own (for sync module fixtures' teardown)."""
    nc = await nats.connect(url)
    try:
        await delete_streams(nc, prefix)
    finally:
        await nc.close()


# -- services in this process ---------------------------------------------------------------------------


#: Small storage budgets for tests: JetStream reserves each stream's cap from the server's store.
BUDGETS: dict[str, Any] = {
    "max_hosts": 64,  # a module's stack keeps every host a test made (streams are reserved only as hosts come)
    "events_max_bytes": 64 * 1024 * 1024,
    "artifacts_max_bytes": 256 * 1024 * 1024,
    "logs_max_bytes": 64 * 32 * 1024 * 1024,  # 32 MiB a host: a test prints 10 MiB
    "uploads_max_bytes": 64 * 40 * 1024 * 1024,
    "artifact_max_file_bytes": 32 * 1024 * 1024,
    "revoked_sessions_max_bytes": 1024 * 1024,  # the dashboard's logged-out sessions: a few per test
}

FAST = {
    # Protocol-level test hosts ack assignments without claiming them, and some tests then expect nothing more:
    # the resync publishes copies only of attempts unclaimed for a minute (its tests set their own age).
    "resync_after_s": 60.0,
    "assign_tick_s": 0.2,
    "relay_tick_s": 0.2,
    "heartbeat_interval_s": 5.0,
    "sweep_interval_s": 0.2,
    "device_grace_s": 0.0,
    "shutdown_grace_s": 5.0,
    "drain_timeout_s": 2.0,
    "db_pool_size": 5,
    **BUDGETS,
}


def scheduler_settings(database_url: str, nats_url: str, prefix: str, **overrides: Any) -> SchedulerSettings:
    """Settings for a test scheduler: fast ticks, no device grace (tests opt in to one), the scheduler's role."""
    values: dict[str, Any] = {
        "database_url": service_url(database_url, "scheduler"),
        "nats_url": nats_url,
        "subject_prefix": prefix,
        **FAST,
        **overrides,
    }
    return SchedulerSettings(**values)


@contextlib.asynccontextmanager
async def running_scheduler(settings: SchedulerSettings) -> AsyncIterator[Scheduler]:
    """A scheduler serving in this event loop until the block ends."""
    scheduler = Scheduler(settings)
    stop = asyncio.Event()
    task = asyncio.create_task(scheduler.run(stop))
    ready = asyncio.create_task(scheduler.ready.wait())
    await asyncio.wait({task, ready}, timeout=30, return_when=asyncio.FIRST_COMPLETED)
    if not scheduler.ready.is_set():
        ready.cancel()
        if task.done():
            task.result()
        task.cancel()
        raise AssertionError("the scheduler did not become ready")
    try:
        yield scheduler
    finally:
        stop.set()
        await asyncio.wait_for(task, timeout=30)


@contextlib.asynccontextmanager
async def running_sweeper(settings: SweeperSettings) -> AsyncIterator[Sweeper]:
    """A sweeper running in this event loop until the block ends."""
    sweeper = Sweeper(settings)
    stop = asyncio.Event()
    task = asyncio.create_task(sweeper.run(stop))
    await asyncio.wait_for(sweeper.ready.wait(), timeout=30)
    try:
        yield sweeper
    finally:
        stop.set()
        await asyncio.wait_for(task, timeout=30)


# -- services as processes ----------------------------------------------------------------------------


def service_env(database_url: str, nats_url: str, prefix: str, **overrides: Any) -> dict[str, str]:
    """The environment of a service process: `DEVSCHED_*` variables, fast test settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DEVSCHED_")}
    values = {"database_url": database_url, "nats_url": nats_url, "subject_prefix": prefix, **FAST, **overrides}
    env.update({f"DEVSCHED_{k.upper()}": str(v) for k, v in values.items() if v is not None})
    env["PYTHONUNBUFFERED"] = "1"
    return env


class ServiceProcess(ChildProcess):
    """`python -m <module>` as a real process with JSON logs to a file; stopped by its pid, and SIGKILLed by the
    kernel if the test run dies (`devsched.embedded.supervisor`)."""

    def __init__(self, module: str, env: Mapping[str, str], log_path: Path, *args: str) -> None:
        super().__init__(module, [sys.executable, "-m", module, *args], env, log_path, stop_timeout=20.0)
        self.module = module

    async def wait_logged(self, message: str, timeout: float = 30.0) -> None:  # noqa: ASYNC109
        """Wait for a log line `message`; fail early if the process exits."""
        deadline = time.monotonic() + timeout
        while not self.logged(message):
            if not self.running:
                raise AssertionError(f"{self.module} exited with {self.exit_code}:\n{self.tail()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.module} did not log {message!r} within {timeout}s:\n{self.tail()}")
            await asyncio.sleep(0.05)

    async def wait_exit(self, timeout: float = 20.0) -> int | None:  # noqa: ASYNC109
        """Wait (in a thread) for the process to exit; returns the exit code."""
        if not await asyncio.to_thread(self.wait, timeout):
            raise AssertionError(f"{self.module} still runs after {timeout}s:\n{self.tail()}")
        return self.exit_code


#: Start a service process: `spawn("scheduler" | "sweeper", **setting_overrides)` (the chaos fixture).
Spawn = Callable[..., ServiceProcess]


def scheduler_process(env: Mapping[str, str], log_path: Path) -> ServiceProcess:
    """A `devsched-scheduler` process (not started), connected to Postgres as the scheduler's role."""
    return ServiceProcess("devsched.scheduler", as_service_role(env, "scheduler"), log_path)


def sweeper_process(env: Mapping[str, str], log_path: Path) -> ServiceProcess:
    """A `devsched-sweeper` process (not started), connected to Postgres as the sweeper's role."""
    return ServiceProcess("devsched.sweeper", as_service_role(env, "sweeper"), log_path)


@dataclass
class ControlPlane:
    """A running scheduler and sweeper for one prefix and one database."""

    prefix: str
    database_url: str
    nats_url: str
    scheduler: ServiceProcess
    sweeper: ServiceProcess


class Lab:
    """One test's own host, devices (labelled with the test's own label) and tasks."""

    def __init__(self, nc: NatsClient, prefix: str) -> None:
        self.nc = nc
        self.prefix = prefix
        self.label = {"lab": uuid.uuid4().hex[:12]}
        self.hosts: list[TestHost] = []

    async def host(self, *device_ids: str) -> TestHost:
        """A registered host with these devices (ids made unique), bound to its consumer."""
        host = TestHost(self.nc, self.prefix)
        self.hosts.append(host)
        await host.register(*((f"{d}-{self.label['lab']}", self.label) for d in device_ids))
        return host

    def device(self, device_id: str) -> str:
        """The unique id this lab gave `device_id`."""
        return f"{device_id}-{self.label['lab']}"

    async def submit(self, **fields: Any) -> str:
        """Submit a task that only this lab's devices match."""
        return await submit(self.nc, self.prefix, selector={"labels": self.label}, **{"plan": plan(), **fields})

    async def close(self) -> None:
        """Unbind every host's consumer."""
        for host in self.hosts:
            await host.close()
