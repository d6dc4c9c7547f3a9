"""The demo workload of `devsched up`: a few tasks that between them show every outcome.

| task | shows | expected |
| --- | --- | --- |
| hello, build-and-test, flash-and-boot, quick-check | ordinary work on the `main` pool | done |
| flaky-test | a failing shell step; the `always` teardown step still runs | failed |
| soak-test | a long interruptible step cancelled while it runs; teardown runs | cancelled |
| needs-hardware | no device matches: it waits (`pending_reason`), then is cancelled while queued | cancelled |
| survives-host-crash | its agent is killed mid-step, restarted: attempt 1 released (or expired), 2 runs | done |

The last one needs a second host (the `flaky` pool); with `--hosts 1` it is left out. `Demo.step()` is
called a few times a second: it looks at the demo's tasks and acts (cancel, crash a host) when each is
where the story needs it.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from devsched.client.client import Client
from devsched.core.errors import DevschedError
from devsched.core.status import TERMINAL, AttemptStatus, EndReason, TaskReason, TaskStatus
from devsched.devstack.layout import FLAKY_POOL, MAIN_POOL, SimHost
from devsched.protocol.messages import TaskView

#: Kills and restarts a host's agent (the demo's simulated crash).
CrashHost = Callable[[str], Awaitable[None]]
#: Prints one line of what the demo is doing.
Say = Callable[[str], None]

Check = Callable[[TaskView], str | None]


def _shell(name: str, command: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "action": "shell", "args": {"command": command}, **extra}


def _sleep(name: str, seconds: float, **extra: Any) -> dict[str, Any]:
    return {"name": name, "action": "sleep", "args": {"seconds": seconds}, **extra}


def _noop(name: str) -> dict[str, Any]:
    return {"name": name, "action": "noop"}


def _step_status(view: TaskView, step: str) -> str | None:
    if view.result is None:
        return None
    return next((str(s.status) for s in view.result.steps if s.name == step), None)


def _teardown_ran(step: str) -> Check:
    def check(view: TaskView) -> str | None:
        status = _step_status(view, step)
        return None if status == "done" else f"teardown step {step!r} is {status or 'missing'}, not done"

    return check


def _cancelled_while_queued(view: TaskView) -> str | None:
    if view.reason != TaskReason.CANCELLED_WHILE_QUEUED or view.attempts:
        return f"expected reason {TaskReason.CANCELLED_WHILE_QUEUED} and no attempt, got {view.reason!r}"
    return None


def _retried_after_the_crash(view: TaskView) -> str | None:
    # The restarted agent releases the attempt its predecessor held; if it comes back only after the lease
    # ran out, the sweeper has ended the attempt as expired first. Either way attempt 2 runs.
    lost = [a for a in view.attempts if a.end_reason in (EndReason.RELEASED, EndReason.LEASE_EXPIRED)]
    if not lost or view.attempts[-1].status != AttemptStatus.DONE:
        ends = [str(a.end_reason) for a in view.attempts]
        return f"expected a released (or expired) attempt and then a done one, got {ends}"
    return None


@dataclass
class DemoTask:
    """One task of the demo: what to submit, what it shows, how it must end."""

    key: str
    shows: str
    body: dict[str, Any]
    expect: TaskStatus
    check: Check | None = None
    task_id: uuid.UUID | None = None
    view: TaskView | None = None
    submitted_at: float = 0.0
    acted: bool = False

    @property
    def finished(self) -> bool:
        """Whether the task has reached a terminal status."""
        return self.view is not None and self.view.status in TERMINAL

    def problem(self) -> str | None:
        """Why the task did not end as expected (None when it did, or has not ended yet)."""
        if self.view is None or not self.finished:
            return None
        if self.view.status != self.expect:
            return f"ended {self.view.status}, expected {self.expect}" + (
                f" ({self.view.reason})" if self.view.reason else ""
            )
        return self.check(self.view) if self.check is not None else None


def demo_tasks(hosts: list[SimHost], run_id: str) -> list[DemoTask]:
    """The demo's tasks for these hosts (see the module docstring)."""
    main = {"labels": {"platform": "sim", "pool": MAIN_POOL}}
    tasks = [
        DemoTask(
            "hello",
            "a one-step shell task",
            {
                "selector": main,
                "plan": {"steps": [_shell("hello", 'echo "hello from $DEVSCHED_DEVICE_ID, serial $SIM_SERIAL"')]},
            },
            TaskStatus.DONE,
        ),
        DemoTask(
            "build-and-test",
            "three steps, higher priority",
            {
                "selector": main,
                "priority": 5,
                "plan": {"steps": [_noop("checkout"), _sleep("build", 1.0), _shell("test", "echo 42 tests passed")]},
            },
            TaskStatus.DONE,
        ),
        DemoTask(
            "flash-and-boot",
            "device env given to shell steps",
            {
                "selector": main,
                "plan": {"steps": [_shell("flash", "echo flashing $SIM_SERIAL"), _sleep("boot", 1.5), _noop("verify")]},
            },
            TaskStatus.DONE,
        ),
        DemoTask(
            "quick-check",
            "a short sleep",
            {
                "selector": main,
                "plan": {"steps": [_sleep("check", 0.5)]},
            },
            TaskStatus.DONE,
        ),
        DemoTask(
            "flaky-test",
            "a failing step; the always step still runs",
            {
                "selector": main,
                "plan": {
                    "steps": [
                        _shell("test", "echo running tests; echo 'FAIL: test_wifi_reconnect' >&2; exit 3"),
                        _shell("upload", "echo never runs"),
                        _shell("collect-logs", "echo collecting logs", always=True),
                    ]
                },
            },
            TaskStatus.FAILED,
            _teardown_ran("collect-logs"),
        ),
        DemoTask(
            "soak-test",
            "cancelled while running; teardown runs",
            {
                "selector": main,
                "priority": 10,
                "plan": {
                    "steps": [
                        _noop("setup"),
                        _sleep("soak", 300, interruptible=True),
                        _shell("teardown", "echo power-cycling $DEVSCHED_DEVICE_ID", always=True),
                    ]
                },
            },
            TaskStatus.CANCELLED,
            _teardown_ran("teardown"),
        ),
        DemoTask(
            "needs-hardware",
            "no device matches: waits, then cancelled while queued",
            {
                "selector": {"labels": {"platform": "android"}},
                "plan": {"steps": [_noop("never")]},
            },
            TaskStatus.CANCELLED,
            _cancelled_while_queued,
        ),
    ]
    flaky = next((h for h in hosts if h.pool == FLAKY_POOL and h.devices), None)
    if flaky is not None:
        tasks.append(
            DemoTask(
                "survives-host-crash",
                f"its host {flaky.host_id} crashes: its restarted agent gives the attempt back, retried",
                {
                    "selector": {"device_id": flaky.devices[0].device_id},
                    "lease_ttl_s": 3,
                    "max_attempts": 3,
                    "plan": {"steps": [_sleep("flash", 5.0)]},
                },
                TaskStatus.DONE,
                _retried_after_the_crash,
            )
        )
    for task in tasks:
        task.body = {**task.body, "name": f"demo-{task.key}", "metadata": {"demo": run_id}}
    return tasks


@dataclass
class Demo:
    """Submits the demo's tasks and drives each to the point its story needs."""

    client: Client
    hosts: list[SimHost]
    crash_host: CrashHost
    say: Say
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:8])
    tasks: list[DemoTask] = field(default_factory=list)

    async def submit(self) -> None:
        """Submit every demo task."""
        self.tasks = demo_tasks(self.hosts, self.run_id)
        for task in self.tasks:
            reply = await self.client.submit(task.body)
            task.task_id = reply.task_id
            task.submitted_at = time.monotonic()
        self.say(f"demo: submitted {len(self.tasks)} tasks (metadata demo={self.run_id})")

    @property
    def finished(self) -> bool:
        """Whether every demo task has ended."""
        return bool(self.tasks) and all(t.finished for t in self.tasks)

    def problems(self) -> list[str]:
        """Every task that ended otherwise than expected, as `name: problem`."""
        return [f"demo-{t.key}: {p}" for t in self.tasks if (p := t.problem()) is not None]

    def unfinished(self) -> list[str]:
        """The tasks still running, as `name (status)`."""
        return [f"demo-{t.key} ({t.view.status if t.view else 'unknown'})" for t in self.tasks if not t.finished]

    async def step(self) -> None:
        """Refresh each unfinished task and act on it where its story needs it."""
        for task in self.tasks:
            if task.task_id is None or task.finished:
                continue
            before = task.view.status if task.view is not None else None
            try:
                task.view = await self.client.get(task.task_id)
            except DevschedError as exc:
                self.say(f"demo: cannot read demo-{task.key}: {exc.code}")
                continue
            if task.view.status != before:
                extra = f" ({task.view.reason})" if task.view.reason and task.finished else ""
                self.say(f"demo-{task.key}: {task.view.status}{extra}")
            if not task.acted:
                await self._act(task, task.view)

    async def _act(self, task: DemoTask, view: TaskView) -> None:
        current = view.attempts[-1] if view.attempts else None
        at_step = current.progress.step if current is not None and current.progress is not None else None
        if task.key == "soak-test" and at_step == "soak" and view.status == TaskStatus.DISPATCHED:
            task.acted = True
            self.say("demo: cancelling demo-soak-test while it runs (its teardown step will still run)")
            await self.client.cancel(view.task_id, "demo: cancelled while running")
        elif task.key == "needs-hardware" and view.status == TaskStatus.QUEUED and view.pending_reason:
            if time.monotonic() - task.submitted_at >= 2.0:
                task.acted = True
                self.say(f"demo: demo-needs-hardware waits ({view.pending_reason}); cancelling it")
                await self.client.cancel(view.task_id, "demo: no such hardware")
        elif (
            task.key == "survives-host-crash"
            and current is not None
            and current.attempt == 1
            and at_step == "flash"
            and view.status == TaskStatus.DISPATCHED
        ):
            task.acted = True
            self.say(
                f"demo: crashing host {current.host_id} while it runs demo-survives-host-crash "
                f"(lease ttl {view.lease_ttl_s} s): the lease will expire and the task be retried"
            )
            await self.crash_host(current.host_id)
