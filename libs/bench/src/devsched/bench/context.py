"""What every phase of a bench run shares: the system, the connections, the sizes, and the results so far."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg

from devsched.bench.figures import Figure
from devsched.bench.options import BenchOptions, Sizes
from devsched.bench.pgstats import PgStats, Statement
from devsched.bench.probes import CpuMeter
from devsched.bench.profiling import PySpy
from devsched.bench.servers import PREFIX, BenchStack
from devsched.client.client import Client
from devsched.core.status import TERMINAL
from devsched.devstack.processes import Child
from devsched.protocol.subjects import Subjects

#: A no-op plan: one step of the agent's built-in `noop` action.
NOOP_PLAN: Mapping[str, Any] = {"steps": [{"name": "noop", "action": "noop", "args": {}}]}

#: An event (its JSON body) that ends a watch.
Until = Callable[[Mapping[str, Any]], bool]


def terminal(event: Mapping[str, Any]) -> bool:
    """The event of a task's end (done, failed, cancelled)."""
    return event.get("status") in TERMINAL


class Watch:
    """The events of some tasks, as they arrive, until each has had one that `until` accepts."""

    def __init__(self, task_ids: Iterable[str], until: Until) -> None:
        self.pending = set(task_ids)
        self.until = until
        #: task_id -> event kind -> `time.perf_counter()` of its first arrival.
        self.arrived: dict[str, dict[str, float]] = {}
        #: task_id -> the event that ended the watch for it.
        self.final: dict[str, Mapping[str, Any]] = {}
        #: task_id -> its latest event seen.
        self.last: dict[str, Mapping[str, Any]] = {}
        self.complete = asyncio.Event()
        if not self.pending:
            self.complete.set()

    def add(self, task_ids: Iterable[str]) -> None:
        """Watch these tasks too (one whose ending event already arrived is through at once)."""
        for task_id in task_ids:
            last = self.last.get(task_id)
            if last is not None and self.until(last):
                self.final[task_id] = last
            else:
                self.pending.add(task_id)
                self.complete.clear()

    def _seen(self, event: Mapping[str, Any], at: float) -> None:
        task_id = str(event.get("task_id"))
        self.arrived.setdefault(task_id, {}).setdefault(str(event.get("event")), at)
        self.last[task_id] = event
        if task_id in self.pending and self.until(event):
            self.pending.discard(task_id)
            self.final[task_id] = event
            if not self.pending:
                self.complete.set()

    async def wait(self, timeout: float, what: str) -> None:  # noqa: ASYNC109
        """Wait until every task is through.

        Raises:
            TimeoutError: some are not, after `timeout` seconds.
        """
        try:
            await asyncio.wait_for(self.complete.wait(), timeout)
        except TimeoutError:
            raise TimeoutError(f"{what}: {len(self.pending)} tasks still pending after {timeout:g} s") from None


class TaskEvents:
    """One core-NATS subscription to every task event (JetStream publishes reach it too); watches share it."""

    def __init__(self, nc: NatsClient, subjects: Subjects) -> None:
        self._nc = nc
        self._subjects = subjects
        self._watches: list[Watch] = []

    async def start(self) -> None:
        """Subscribe."""
        await self._nc.subscribe(self._subjects.task_events_all, cb=self._on_event)
        await self._nc.flush()
        await self._nc.flush()

    async def _on_event(self, msg: Msg) -> None:
        at = time.perf_counter()
        event = json.loads(msg.data)
        for watch in self._watches:
            watch._seen(event, at)

    def watch(self, task_ids: Iterable[str] = (), until: Until = terminal) -> Watch:
        """A new watch, live until `forget`."""
        watch = Watch(task_ids, until)
        self._watches.append(watch)
        return watch

    def forget(self, watch: Watch) -> None:
        """Stop feeding `watch`."""
        self._watches.remove(watch)


@dataclass
class Context:
    """One bench run's shared state."""

    options: BenchOptions
    stack: BenchStack
    nc: NatsClient
    client: Client
    pg: PgStats
    events: TaskEvents
    figures: list[Figure] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)
    #: Latency samples for the plot (not in the JSON): name -> milliseconds.
    samples: dict[str, list[float]] = field(default_factory=dict)
    #: py-spy profiles taken: file name -> (units of work in them, what a unit is, the scheduler's CPU seconds).
    spied: dict[str, tuple[int, str, float]] = field(default_factory=dict)
    #: The statements of each measured load: name -> (statements, units of work, what a unit is).
    sql_profiles: dict[str, tuple[list[Statement], int, str]] = field(default_factory=dict)
    log: Callable[[str], None] = print

    @property
    def sizes(self) -> Sizes:
        """How much work each phase does."""
        return self.options.sizes

    @property
    def subjects(self) -> Subjects:
        """The deployment's names."""
        return Subjects(PREFIX)

    @property
    def profile_dir(self) -> Path | None:
        """Where profiles go, when asked for."""
        return self.options.profile_dir

    async def stream_messages(self) -> int:
        """Messages JetStream has stored so far, every stream together (last sequence: acks remove none)."""
        js, total, offset = self.nc.jetstream(), 0, 0
        while page := await js.streams_info(offset):  # a page of at most 256 streams
            total += sum(info.state.last_seq for info in page)
            offset += len(page)
        return total

    def meter(self, *trees: str) -> CpuMeter:
        """A CPU meter over these process trees (names of `BenchStack.pids()`), or all of them."""
        pids = self.stack.pids()
        return CpuMeter({name: pids.get(name) for name in trees} if trees else pids)

    def spy(self, name: str, process: Child | None = None) -> PySpy | None:
        """py-spy on `process` (the scheduler by default) into `<profile dir>/<name>.raw`.

        None when profiles are not asked for or py-spy does not work.
        """
        target = self.stack.scheduler if process is None else process
        if self.profile_dir is None or target is None or target.pid is None:
            return None
        spy = PySpy(target.pid, self.profile_dir / f"{name}.raw")
        if not spy.start():
            self.say(f"  profile {name}: {spy.error}")
            return None
        return spy

    def stop_spy(self, spy: PySpy) -> None:
        """Stop `spy`; says so when it wrote nothing."""
        if not spy.stop():
            self.say(f"  profile {spy.output.name}: py-spy wrote nothing: {spy.error}")

    def say(self, message: str) -> None:
        """A progress line."""
        self.log(message)

    async def wait_scheduler(self, timeout: float = 60.0) -> None:  # noqa: ASYNC109
        """Wait until the scheduler answers.

        Raises:
            TimeoutError: it does not, after `timeout` seconds.
            RuntimeError: a service died meanwhile.
        """
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.stack.check_running()
            try:
                await self.client.hosts()
                return
            except Exception:  # no responders yet, or a timeout while it starts
                await asyncio.sleep(0.2)
        raise TimeoutError(f"the scheduler does not answer after {timeout:g} s")

    async def wait_host(self, host_id: str, devices: int, *, timeout: float = 60.0) -> list[str]:  # noqa: ASYNC109
        """Wait until `host_id` is online with `devices` devices; returns their ids.

        Raises:
            TimeoutError: it is not, after `timeout` seconds.
            RuntimeError: a service died meanwhile.
        """
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.stack.check_running()
            for host in await self.client.hosts():
                if host.host_id == host_id and host.online and len(host.devices) == devices:
                    return [d.device_id for d in host.devices]
            await asyncio.sleep(0.2)
        raise TimeoutError(f"host {host_id} not online with {devices} devices after {timeout:g} s")
