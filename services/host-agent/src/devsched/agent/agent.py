"""The host agent: the composition of its parts, and the resources they share.

Startup: check who steps run as; take the spool (one agent per spool); kill the step processes an
earlier agent left and spool the release of every attempt it held (`orphans.py`, `held.py`), and remember
the attempts earlier runs took (`taken.py`), so a copy of one's assignment is dropped; take the work
directory, clearing it; check the NATS credentials; connect (retrying forever), register (retrying), start
heartbeats, listen for nudges, resend spooled reports and releases (so a device an earlier agent held is
free at once); then take assignments until stopped (SIGTERM) or drained (SIGUSR1, or the scheduler's drain
notice), and wind down (`shutdown.py`): a drained agent exits 0 once idle.

| part | module | holds |
| --- | --- | --- |
| registration | `registration.py` | register (retried), re-register on 404, heartbeats |
| intake | `intake.py` | the assignments consumer `host-<host_id>`: bind, fetch, drop duplicates; nudges |
| device workers | `workers.py` | one worker per device, one attempt at a time: claim, run, end |
| report delivery | `delivery.py` | reports and releases delivered in the background, resent at start |
| log streaming | `logstream.py` | each attempt's step output published live to `<PU>_LOGS` |
| shutdown | `shutdown.py` | the phases after SIGTERM or a drain: no new work, grace, stop, kill, release |
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass

from nats.aio.client import Client

from devsched.agent.actions import ActionRegistry, agent_registry
from devsched.agent.attempt import Attempt, AttemptKey
from devsched.agent.client import HostClient
from devsched.agent.config import AgentConfig, ConfigError, DeviceConfig
from devsched.agent.delivery import ReportDelivery
from devsched.agent.health import add_checks
from devsched.agent.held import HeldAttempt, HeldAttempts
from devsched.agent.intake import Intake, Received
from devsched.agent.logstream import LogStreams, jetstream_publish
from devsched.agent.metrics import PARKED, READY, SPOOL
from devsched.agent.metrics import REGISTRY as METRICS
from devsched.agent.orphans import StepGroups
from devsched.agent.registration import Registration
from devsched.agent.renewals import RenewalBatcher
from devsched.agent.reporter import Reporter, encode_report
from devsched.agent.reports import ReportBatcher
from devsched.agent.shutdown import Graces, shut_down, wait_idle
from devsched.agent.spool import Spool, SpoolLocked, SpoolUnsafe, release_key
from devsched.agent.steps import StepUser
from devsched.agent.taken import remembered
from devsched.agent.uploads import UploadLimits, uploads_factory
from devsched.agent.workers import DeviceWorkers
from devsched.agent.workspace import (
    Workspace,
    WorkspaceLocked,
    check_secret_files,
    resolve_step_user,
    workspace_name,
)
from devsched.protocol import messages as wire
from devsched.protocol.subjects import HostVerb, Subjects
from devsched.protocol.tls import TlsConfigError
from devsched.service import HealthServer, Stopped, bind, close_nats, connect_nats, serving_health
from devsched.service.metrics import serve_metrics
from devsched.service.version import service_version

logger = logging.getLogger(__name__)

#: The signal that drains the agent (a Kubernetes preStop hook sends it): finish, take no more, exit 0.
DRAIN_SIGNAL = signal.SIGUSR1
#: How long the last look at the assignments consumer waits for an assignment published late.
SWEEP_WAIT_S = 1.0


def agent_version() -> str:
    """The installed version of devsched-agent (what it registers with and `--version` prints)."""
    return service_version("devsched-agent")


@dataclass(frozen=True, slots=True)
class _Taken:
    """What the agent took at start and its parts share."""

    spool: Spool
    workspace: Workspace
    groups: StepGroups
    held: HeldAttempts
    #: The attempts taken before this start, oldest first: a copy of one's assignment is dropped.
    taken: list[AttemptKey]


class Agent:
    """One host's agent; `serve` runs it until `stop` is set."""

    def __init__(self, config: AgentConfig, *, registry: ActionRegistry | None = None) -> None:
        self.config = config
        self.subjects = Subjects(config.subject_prefix)
        self.registry = registry if registry is not None else agent_registry()
        self.version = agent_version()
        #: Set once registered, for tests and health checks.
        self.registered = asyncio.Event()
        #: Set once bound to the assignments consumer.
        self.bound = asyncio.Event()
        #: The attempts an earlier run of this agent held when it died (read at start and released, `held.py`).
        self.held_at_start: list[HeldAttempt] = []
        #: Set to drain: finish the running work, take no more, exit 0 once idle (`request_drain`).
        self.draining = asyncio.Event()
        #: Whether the drain came from the scheduler (its devices are drained there already).
        self._drained_by_scheduler = False
        #: The NATS connection once made (for the readiness checks).
        self.nc: Client | None = None
        #: The health endpoints while serving, when `metrics_port` is set.
        self.health: HealthServer | None = None
        #: The registration while connected (for the readiness checks: a refused one says why).
        self.registration: Registration | None = None
        #: Spool keys of the reports parked in this run (`Reporter`): not sent again before the next start.
        self.parked_reports: set[str] = set()

    def request_drain(self, source: str, reason: str | None = None) -> None:
        """Drain: finish the running attempts, take no more work, and exit 0 once idle.

        `source` is `signal` (SIGUSR1, as a preStop hook sends it) or `scheduler` (`devsched drain --host`).
        """
        if self.draining.is_set():
            return
        self._drained_by_scheduler = source == "scheduler"
        logger.info("draining: finishing running work, taking no more", extra={"source": source, "reason": reason})
        self.draining.set()

    async def serve(self, stop: asyncio.Event) -> int:
        """Run until `stop` is set (or drained and idle), then shut down gracefully; returns the exit code.

        The health endpoints (`metrics_port`, `health.py`) answer from the start to the end.
        """
        config = self.config
        async with serving_health(config.metrics_host, config.metrics_port, service="devsched-agent") as health:
            if health is not None:
                add_checks(health, self)
                serve_metrics(health, METRICS, ready=READY, component="agent")
            self.health = health
            return await self._serve(stop)

    async def _serve(self, stop: asyncio.Event) -> int:
        with bind(host_id=self.config.host_id), contextlib.ExitStack() as taken:
            taken.enter_context(self._drain_signal())
            try:
                user = await asyncio.to_thread(self._step_user)
            except ConfigError as exc:
                logger.error("invalid agent config", extra={"error": str(exc)})
                return 2
            try:
                spool = await asyncio.to_thread(Spool, self.config.spool_dir)
                await asyncio.to_thread(spool.lock)
                taken.callback(spool.unlock)
                if self.config.metrics_port is not None:
                    SPOOL.depth = spool.depth
                    PARKED.count = self.parked_reports.__len__
                groups, held, taken_before = await asyncio.to_thread(self._recover, spool)
            except (OSError, SpoolLocked, SpoolUnsafe) as exc:
                logger.error("cannot use the spool directory", extra={"error": str(exc)})
                return 1
            try:
                workspace = await asyncio.to_thread(self._take_workspace, user)
            except ConfigError as exc:
                logger.error("invalid agent config", extra={"error": str(exc)})
                return 2
            except (OSError, WorkspaceLocked) as exc:
                logger.error("cannot use the work directory", extra={"error": str(exc)})
                return 1
            taken.callback(workspace.close)
            try:  # files only: the agent's URL carries no secret
                self.config.check()
            except TlsConfigError as exc:
                logger.error("unusable NATS credentials or TLS settings", extra={"error": str(exc)})
                return 2
            try:
                nc = await connect_nats(
                    self.config,
                    name=f"devsched-agent-{self.config.host_id}",
                    stop=stop,
                    drain_timeout_s=self.config.drain_timeout_s,
                    host_id=self.config.host_id,
                )
            except Stopped:
                return 0
            self.nc = nc
            try:
                await self._serve_connected(nc, _Taken(spool, workspace, groups, held, taken_before), stop)
            finally:
                await close_nats(nc)
            return 0

    @contextlib.contextmanager
    def _drain_signal(self) -> Iterator[None]:
        """SIGUSR1 drains the agent while it serves (where the loop can take signals: the main thread)."""
        loop = asyncio.get_running_loop()
        try:
            loop.add_signal_handler(DRAIN_SIGNAL, self.request_drain, "signal")
        except (ValueError, RuntimeError, NotImplementedError):  # not the main thread: no signals here
            yield
            return
        try:
            yield
        finally:
            loop.remove_signal_handler(DRAIN_SIGNAL)

    def _step_user(self) -> StepUser | None:
        """Check who steps run as and what they could read (blocking).

        Raises:
            ConfigError: `step_user` cannot be used, or a secret file is open to it.
        """
        config = self.config
        user = resolve_step_user(config.step_user) if config.step_user is not None else None
        for warning in check_secret_files(config, user):
            logger.warning("credentials file open to other users", extra={"error": warning})
        if user is None and os.geteuid() == 0:
            logger.warning("steps run as root: set step_user in agent.toml to run them as an unprivileged user")
        return user

    def _recover(self, spool: Spool) -> tuple[StepGroups, HeldAttempts, list[AttemptKey]]:
        """Kill the step processes an earlier agent left, take the attempts it held, and read those taken (blocking).

        First thing once the spool is this agent's: an earlier agent's steps must not run on into this
        one's, nor write into the attempt directories about to be cleared.

        Raises:
            OSError: the spool's records cannot be read or written.
        """
        groups = StepGroups.in_spool(spool)
        groups.sweep()  # first: the attempts below are released on the word that nothing of them runs

        def spool_release(attempt: HeldAttempt) -> None:
            spool.put(release_key(attempt.task_id, attempt.attempt), encode_report(attempt.release()))

        held = HeldAttempts.in_spool(spool)
        self.held_at_start = held.take_left({report.attempt_key for report in spool.pending()}, spool_release)
        for attempt in self.held_at_start:
            logger.warning("attempt held by an earlier agent", extra={**attempt.log_fields(), "action": "release"})
        # The attempts left held moved to the taken ones above (a failed hand-over left its record held).
        taken = remembered(held.taken.load(), held.keys(), [report.attempt_key for report in spool.pending()])
        if taken:
            logger.info("remembering the attempts taken before this start", extra={"attempts": len(taken)})
        return groups, held, taken

    def _take_workspace(self, user: StepUser | None) -> Workspace:
        """Take the work directory, removing what an earlier agent left in it (blocking).

        Raises:
            ConfigError: `work_dir` is unsafe, or unusable for the step user.
            WorkspaceLocked: another agent of this host holds the work directory.
            OSError: the work directory cannot be created.
        """
        config = self.config
        workspace = Workspace(config.work_dir, workspace_name(config.host_id, config.spool_dir), user)
        removed = workspace.open()
        if removed:
            logger.warning(
                "removed attempt directories left by an earlier agent",
                extra={"path": str(workspace.directory), "removed": " ".join(removed)},
            )
        return workspace

    async def _serve_connected(self, nc: Client, taken: _Taken, stop: asyncio.Event) -> None:
        config = self.config
        client = HostClient(nc, self.subjects, config.host_id, timeout_s=config.request_timeout_s)
        renewals = RenewalBatcher(client, timeout_s=config.request_timeout_s) if config.batch_renewals else None
        registration = Registration(
            client, config.devices, self.version, actions=self.registry.offers(), registered=self.registered
        )
        self.registration = registration
        reporter = Reporter(
            client,
            taken.spool,
            on_not_found=registration.reregister,
            park_after_s=config.report_park_after_s,
            parked=self.parked_reports,
            batcher=ReportBatcher(client) if config.batch_reports else None,
        )
        reports = ReportDelivery(reporter)
        logs = (
            LogStreams(
                jetstream_publish(nc, timeout_s=config.request_timeout_s),
                self.subjects,
                config.host_id,
                config.log_limits(nc.max_payload),
                flush_s=config.log_flush_s,
                stall_s=config.request_timeout_s,
            )
            if config.log_streaming
            else None
        )

        uploads = (
            uploads_factory(
                nc,
                self.subjects,
                config.host_id,
                limits=UploadLimits(config.artifact_max_file_bytes, config.artifact_max_attempt_bytes),
                stop_grace_s=config.stop_grace_s,
                timeout_s=config.request_timeout_s,
            )
            if config.artifact_uploads
            else None
        )

        def new_attempt(received: Received, device: DeviceConfig) -> Attempt:
            return Attempt(
                received.assignment,
                device,
                client=client,
                reporter=reporter,
                registry=self.registry,
                stop_grace_s=config.stop_grace_s,
                request_timeout_s=config.request_timeout_s,
                received_at=received.received_at,
                workspace=taken.workspace,
                groups=taken.groups,
                logs=logs,
                uploads=uploads,
                renewals=renewals,
            )

        workers = DeviceWorkers(config.devices, new_attempt=new_attempt, reports=reports, held=taken.held)
        intake = Intake(
            self.subjects,
            config.host_id,
            workers,
            batch=len(config.devices),
            reregister=registration.reregister,
            bound=self.bound,
            on_drain=lambda reason: self.request_drain("scheduler", reason),
            remembered=taken.taken,
        )
        # an attempt a report's reply hands over is remembered with the intake's, so no copy of it runs twice

        async def take_handed(handed: wire.HandedAttempt, sent_at: float) -> None:
            await workers.take_handed(handed, sent_at, intake.take)

        reports.on_next = take_handed
        # Work is taken until SIGTERM or a drain, whichever comes first; the shutdown grace counts from then.
        no_more = asyncio.Event()
        taking = asyncio.create_task(_until_either(stop, self.draining, then=no_more))
        nudges = None
        try:
            if not await registration.register_until_done(no_more):
                return
            registration.start_heartbeats(on_answer=reports.kick)
            nudges = await nc.subscribe(self.subjects.host(config.host_id, HostVerb.NUDGE), cb=intake.on_nudge)
            workers.start()
            # Before taking new work: SIGTERM during a long outage leaves them in the spool.
            await reports.resend_spooled(stop)
            js = nc.jetstream(prefix=config.jetstream_api_prefix)
            await intake.consume(js, no_more)
            since = await taking
            draining = not stop.is_set()

            async def withdraw() -> None:
                if not self._drained_by_scheduler:  # the scheduler's drain keeps them listed, drained
                    await registration.withdraw()

            graces = Graces.of(config)
            why = "agent draining" if draining else "agent shutting down"
            await shut_down(workers, reports, graces, withdraw=withdraw, stop=stop, since=since, why=why)
            swept = 0
            with contextlib.suppress(TimeoutError):  # NATS away: what is left there waits for the next start
                async with asyncio.timeout(SWEEP_WAIT_S + graces.request_timeout_s):
                    swept = await intake.sweep(js, SWEEP_WAIT_S)
            if swept:
                await wait_idle(lambda: workers.tasks | reports.tasks, 2 * graces.request_timeout_s)
            if draining and not stop.is_set():
                logger.info("drained: nothing runs here any more; exiting")
        finally:
            taking.cancel()
            background = [taking, *workers.cancel(), *registration.cancel(), *reports.cancel()]
            await asyncio.gather(*background, return_exceptions=True)
            if nudges is not None:
                with contextlib.suppress(Exception):
                    await nudges.unsubscribe()


async def _until_either(first: asyncio.Event, second: asyncio.Event, *, then: asyncio.Event) -> float:
    """Wait for either event, set `then`, and return when (monotonic)."""
    waits = [asyncio.ensure_future(first.wait()), asyncio.ensure_future(second.wait())]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            w.cancel()
    then.set()
    return time.monotonic()
