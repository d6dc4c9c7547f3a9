"""The host agent: the composition of its parts, and the resources they share.

Startup: check who steps run as; take the spool (one agent per spool); kill the step processes an
earlier agent left and read the attempts it held (`orphans.py`, `held.py`); take the work directory,
clearing it; check the NATS credentials; connect (retrying forever), register (retrying), start
heartbeats, resend spooled reports, listen for nudges; then take assignments until stopped, and shut down.

| part | module | holds |
| --- | --- | --- |
| registration | `registration.py` | register (retried), re-register on 404, heartbeats |
| intake | `intake.py` | the assignments consumer `host-<host_id>`: bind, fetch, drop duplicates; nudges |
| device workers | `workers.py` | one worker per device, one attempt at a time: claim, run, end |
| report delivery | `delivery.py` | reports delivered in the background, resent at start, left spooled at shutdown |
| shutdown | `shutdown.py` | the phases after SIGTERM: no new work, grace, stop, kill, give up reports |
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from dataclasses import dataclass
from importlib import metadata

from nats.aio.client import Client

from devsched.agent.actions import ActionRegistry, default_registry
from devsched.agent.attempt import Attempt
from devsched.agent.client import HostClient
from devsched.agent.config import AgentConfig, ConfigError, DeviceConfig
from devsched.agent.delivery import ReportDelivery
from devsched.agent.held import HeldAttempt, HeldAttempts
from devsched.agent.intake import Intake, Received
from devsched.agent.orphans import StepGroups
from devsched.agent.registration import Registration
from devsched.agent.reporter import Reporter
from devsched.agent.shutdown import Graces, shut_down
from devsched.agent.spool import Spool, SpoolLocked, SpoolUnsafe
from devsched.agent.steps import StepUser
from devsched.agent.workers import DeviceWorkers
from devsched.agent.workspace import (
    Workspace,
    WorkspaceLocked,
    check_secret_files,
    resolve_step_user,
    workspace_name,
)
from devsched.protocol.subjects import HostVerb, Subjects
from devsched.protocol.tls import TlsConfigError
from devsched.service import ServiceSettings, Stopped, bind, close_nats, connect_nats

logger = logging.getLogger(__name__)


def agent_version() -> str:
    """The installed version of devsched-agent."""
    try:
        return metadata.version("devsched-agent")
    except metadata.PackageNotFoundError:  # pragma: no cover - running from a source tree
        return "unknown"


@dataclass(frozen=True, slots=True)
class _Taken:
    """What the agent took at start and its parts share."""

    spool: Spool
    workspace: Workspace
    groups: StepGroups
    held: HeldAttempts


def host_inbox_prefix(host_id: str) -> str:
    """`_INBOX.<host_id>`: the host's replies and fetched assignments, so permissions can pin it there."""
    return f"_INBOX.{host_id}"


class Agent:
    """One host's agent; `serve` runs it until `stop` is set."""

    def __init__(self, config: AgentConfig, *, registry: ActionRegistry | None = None) -> None:
        self.config = config
        self.subjects = Subjects(config.subject_prefix)
        self.registry = registry if registry is not None else default_registry()
        self.version = agent_version()
        #: Set once registered, for tests and health checks.
        self.registered = asyncio.Event()
        #: Set once bound to the assignments consumer.
        self.bound = asyncio.Event()
        #: The attempts an earlier run of this agent held when it died (read at start, `held.py`).
        self.held_at_start: list[HeldAttempt] = []

    async def serve(self, stop: asyncio.Event) -> int:
        """Run until `stop` is set, then shut down gracefully; returns the exit code."""
        with bind(host_id=self.config.host_id), contextlib.ExitStack() as taken:
            try:
                user = await asyncio.to_thread(self._step_user)
            except ConfigError as exc:
                logger.error("invalid agent config", extra={"error": str(exc)})
                return 2
            try:
                spool = await asyncio.to_thread(Spool, self.config.spool_dir)
                await asyncio.to_thread(spool.lock)
                taken.callback(spool.unlock)
                groups, held = await asyncio.to_thread(self._recover, spool)
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
            access = self.config.nats_access()  # files only: the agent's URL carries no secret
            try:
                access.check()
            except TlsConfigError as exc:
                logger.error("unusable NATS credentials or TLS settings", extra={"error": str(exc)})
                return 2
            settings = ServiceSettings(
                nats_url=self.config.nats_url,
                nats_creds=access.creds,
                nats_nkey_seed=access.nkey_seed,
                nats_user=access.user,
                nats_password_file=access.password_file,
                nats_tls_ca=access.tls_ca,
                nats_tls_cert=access.tls_cert,
                nats_tls_key=access.tls_key,
                nats_tls_hostname=access.tls_hostname,
                subject_prefix=self.config.subject_prefix,
                drain_timeout_s=self.config.drain_timeout_s,
            )
            try:
                nc = await connect_nats(
                    settings,
                    name=f"devsched-agent-{self.config.host_id}",
                    stop=stop,
                    inbox_prefix=host_inbox_prefix(self.config.host_id),
                )
            except Stopped:
                return 0
            try:
                await self._serve_connected(nc, _Taken(spool, workspace, groups, held), stop)
            finally:
                await close_nats(nc)
            return 0

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

    def _recover(self, spool: Spool) -> tuple[StepGroups, HeldAttempts]:
        """Kill the step processes an earlier agent left, and take the attempts it held (blocking).

        First thing once the spool is this agent's: an earlier agent's steps must not run on into this
        one's, nor write into the attempt directories about to be cleared.

        Raises:
            OSError: the spool's records cannot be read or written.
        """
        groups = StepGroups.in_spool(spool)
        groups.sweep()
        held = HeldAttempts.in_spool(spool)
        self.held_at_start = held.take_left({report.key for report in spool.pending()})
        for attempt in self.held_at_start:
            logger.warning("attempt held by an earlier agent", extra=attempt.log_fields())
        return groups, held

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
        registration = Registration(client, config.devices, self.version, registered=self.registered)
        reporter = Reporter(client, taken.spool, on_not_found=registration.reregister)
        reports = ReportDelivery(reporter)

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
            )

        workers = DeviceWorkers(config.devices, new_attempt=new_attempt, reports=reports, held=taken.held)
        intake = Intake(
            self.subjects,
            config.host_id,
            workers,
            batch=len(config.devices),
            reregister=registration.reregister,
            bound=self.bound,
        )
        if not await registration.register_until_done(stop):
            return
        registration.start_heartbeats(on_answer=reports.kick)
        nudges = await nc.subscribe(self.subjects.host(config.host_id, HostVerb.NUDGE), cb=intake.on_nudge)
        workers.start()
        try:
            # Before taking new work: SIGTERM during a long outage leaves them in the spool.
            await reports.resend_spooled(stop)
            await intake.consume(nc.jetstream(prefix=config.jetstream_api_prefix), stop)
            await shut_down(workers, reports, Graces.of(config))
        finally:
            background = [*workers.cancel(), *registration.cancel(), *reports.cancel()]
            await asyncio.gather(*background, return_exceptions=True)
            with contextlib.suppress(Exception):
                await nudges.unsubscribe()
