"""The host agent: registers its devices, takes assignments from its durable consumer, runs them.

Startup: connect (retrying forever), register (retrying), start heartbeats, resend spooled reports,
listen for nudges, bind the pull consumer `host-<host_id>` (which the scheduler creates at registration,
so binding is retried), then fetch.

Work: each device has a queue and one worker, so a device runs at most one attempt at a time and
devices run in parallel. An assignment for a busy device WAITS in that device's queue (kept from
redelivery with `in_progress`) rather than being nak'd: the scheduler only assigns a device it has
released, so the wait is short (the previous attempt is ending, or its lease expired while a step
was finishing), and the waiting assignment is claimed the moment the device is free instead of at a
guessed redelivery delay. A duplicate delivery of an attempt this agent already holds is acked and
dropped: a repeated claim of the same lease succeeds, so only this check keeps one attempt from
running twice. An assignment is acked once claimed or found stale.

Shutdown (SIGTERM): no new work; queued assignments are nak'd; running attempts get
`shutdown_grace_s` to finish, then stop as for a lease loss, then (after the stop grace) every step
is interrupted; reports are flushed or left in the spool; the connection is drained.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections import OrderedDict
from collections.abc import Awaitable
from dataclasses import dataclass
from importlib import metadata

import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js.client import JetStreamContext
from opentelemetry.trace import SpanKind

from devsched.agent.actions import ActionRegistry, default_registry
from devsched.agent.attempt import Attempt, AttemptKey, ClaimOutcome
from devsched.agent.client import HostClient
from devsched.agent.config import AgentConfig, ConfigError, DeviceConfig
from devsched.agent.reporter import Reporter
from devsched.agent.spool import Spool, SpooledReport, SpoolLocked, SpoolUnsafe
from devsched.agent.workspace import (
    Workspace,
    WorkspaceLocked,
    check_secret_files,
    resolve_step_user,
    workspace_name,
)
from devsched.core.backoff import backoff_delay, retry_after
from devsched.core.errors import DeviceConflict, InvalidRequest, NotFound
from devsched.protocol import messages as wire
from devsched.protocol.codec import decode
from devsched.protocol.subjects import HostVerb, Subjects
from devsched.protocol.tls import TlsConfigError
from devsched.protocol.tracing import extract, tracer, use_context
from devsched.service import ServiceSettings, Stopped, bind, close_nats, connect_nats, sleep_or_stop

logger = logging.getLogger(__name__)

#: How long one pull waits for assignments.
FETCH_WAIT_S = 5.0
#: Attempt keys remembered to drop duplicate deliveries.
REMEMBERED_ATTEMPTS = 4096


def agent_version() -> str:
    """The installed version of devsched-agent."""
    try:
        return metadata.version("devsched-agent")
    except metadata.PackageNotFoundError:  # pragma: no cover - running from a source tree
        return "unknown"


@dataclass(slots=True)
class _Delivery:
    msg: Msg
    assignment: wire.Assignment
    keepalive: asyncio.Task[None]
    received_at: float


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
        self.heartbeat_interval_s = 5.0
        self.ack_wait_s = 30.0
        self._known: OrderedDict[AttemptKey, None] = OrderedDict()
        self._running: dict[AttemptKey, Attempt] = {}
        self._attempt_tasks: set[asyncio.Task[None]] = set()
        #: Reports being delivered: apart from the device workers, so an outage does not hold a device.
        self._report_tasks: set[asyncio.Task[None]] = set()
        self._queues: dict[str, asyncio.Queue[_Delivery]] = {d.device_id: asyncio.Queue() for d in config.devices}
        self._stopping = asyncio.Event()
        self._give_up_reports = asyncio.Event()
        self._register_lock = asyncio.Lock()
        self._client: HostClient | None = None
        self._reporter: Reporter | None = None
        self._workspace: Workspace | None = None
        #: Set once registered, for tests and health checks.
        self.registered = asyncio.Event()
        #: Set once bound to the assignments consumer.
        self.bound = asyncio.Event()

    # -- the whole life --------------------------------------------------------------------------------

    async def serve(self, stop: asyncio.Event) -> int:
        """Run until `stop` is set, then shut down gracefully; returns the exit code."""
        with bind(host_id=self.config.host_id):
            try:
                self._workspace = await asyncio.to_thread(self._confine)
            except ConfigError as exc:
                logger.error("invalid agent config", extra={"error": str(exc)})
                return 2
            except (OSError, WorkspaceLocked) as exc:
                logger.error("cannot use the work directory", extra={"error": str(exc)})
                return 1
            try:
                spool = await asyncio.to_thread(Spool, self.config.spool_dir)
                await asyncio.to_thread(spool.lock)
            except (OSError, SpoolLocked, SpoolUnsafe) as exc:
                logger.error("cannot use the spool directory", extra={"error": str(exc)})
                self._workspace.close()
                return 1
            access = self.config.nats_access()  # files only: the agent's URL carries no secret
            try:
                access.check()
            except TlsConfigError as exc:
                logger.error("unusable NATS credentials or TLS settings", extra={"error": str(exc)})
                spool.unlock()
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
                spool.unlock()
                self._workspace.close()
                return 0
            try:
                await self._serve_connected(nc, spool, stop)
            finally:
                await close_nats(nc)
                spool.unlock()
                self._workspace.close()
            return 0

    def _confine(self) -> Workspace:
        """Check who steps run as and what they could read, then take the work directory (blocking).

        Raises:
            ConfigError: `step_user` cannot be used, a secret file is open to it, or `work_dir` is unsafe.
            WorkspaceLocked: another agent of this host holds the work directory.
            OSError: the work directory cannot be created.
        """
        config = self.config
        user = resolve_step_user(config.step_user) if config.step_user is not None else None
        for warning in check_secret_files(config, user):
            logger.warning("credentials file open to other users", extra={"error": warning})
        if user is None and os.geteuid() == 0:
            logger.warning("steps run as root: set step_user in agent.toml to run them as an unprivileged user")
        workspace = Workspace(config.work_dir, workspace_name(config.host_id, config.spool_dir), user)
        removed = workspace.open()
        if removed:
            logger.warning(
                "removed attempt directories left by an earlier agent",
                extra={"path": str(workspace.directory), "removed": " ".join(removed)},
            )
        return workspace

    async def _serve_connected(self, nc: Client, spool: Spool, stop: asyncio.Event) -> None:
        client = HostClient(nc, self.subjects, self.config.host_id, timeout_s=self.config.request_timeout_s)
        self._client = client
        self._reporter = Reporter(client, spool, on_not_found=self._reregister)
        if not await self._register_until_done(stop):
            return
        heartbeats = asyncio.create_task(self._heartbeat_loop())
        nudges = await nc.subscribe(self.subjects.host(self.config.host_id, HostVerb.NUDGE), cb=self._on_nudge)
        workers = [asyncio.create_task(self._work(device)) for device in self.config.devices]
        try:
            await self._resend_spooled(stop)
            await self._consume(nc.jetstream(prefix=self.config.jetstream_api_prefix), stop)
            await self._shut_down()
        finally:
            background = [*workers, heartbeats, *self._attempt_tasks, *self._report_tasks]
            for task in background:
                task.cancel()
            await asyncio.gather(*background, return_exceptions=True)
            with contextlib.suppress(Exception):
                await nudges.unsubscribe()

    # -- registration and liveness -----------------------------------------------------------------------

    async def _register(self) -> None:
        assert self._client is not None
        devices = [wire.DeviceRegistration(device_id=d.device_id, labels=d.labels) for d in self.config.devices]
        async with self._register_lock:
            reply = await self._client.register(devices, self.version)
        self.heartbeat_interval_s = reply.heartbeat_interval_s
        self.registered.set()
        logger.info("registered", extra={"devices": len(devices), "heartbeat_interval_s": reply.heartbeat_interval_s})

    async def _register_until_done(self, stop: asyncio.Event) -> bool:
        failures = 0
        while not stop.is_set():
            pause = 0.0
            try:
                await self._register()
                return True
            except Exception as exc:
                pause = retry_after(exc)
                failures += 1
                level = logging.ERROR if isinstance(exc, DeviceConflict | InvalidRequest) else logging.WARNING
                logger.log(level, "registration failed, will retry", extra={"error": repr(exc), "failures": failures})
            await sleep_or_stop(stop, max(backoff_delay(failures, base_s=0.2, cap_s=10.0), pause))
        return False

    async def _reregister(self) -> None:
        """Register again (the scheduler answered 404: it no longer knows this host)."""
        try:
            await self._register()
        except Exception as exc:
            logger.warning("re-registration failed", extra={"error": repr(exc)})

    async def _heartbeat_loop(self) -> None:
        assert self._client is not None
        while True:
            await asyncio.sleep(self.heartbeat_interval_s)
            try:
                reply = await self._client.heartbeat()
                self.heartbeat_interval_s = reply.heartbeat_interval_s
                if self._reporter is not None:
                    self._reporter.kick()
            except NotFound:
                await self._reregister()
            except Exception as exc:
                logger.warning("heartbeat failed", extra={"error": repr(exc)})

    # -- reports left from before ------------------------------------------------------------------------

    async def _resend_spooled(self, stop: asyncio.Event) -> None:
        assert self._reporter is not None
        pending = await self._reporter.pending()
        if pending:
            logger.info("resending spooled reports", extra={"count": len(pending)})
        # Stop before taking new work: SIGTERM during a long outage leaves them in the spool.
        await asyncio.gather(*(self._reporter.deliver(report, give_up=stop) for report in pending))

    # -- assignments ---------------------------------------------------------------------------------------

    async def _bind(self, js: JetStreamContext, stop: asyncio.Event) -> JetStreamContext.PullSubscription | None:
        stream, durable = self.subjects.assignments_stream, self.subjects.consumer(self.config.host_id)
        failures = 0
        while not stop.is_set():
            try:
                info = await js.consumer_info(stream, durable)
                if info.config.ack_wait:
                    self.ack_wait_s = float(info.config.ack_wait)
                psub = await js.pull_subscribe_bind(durable=durable, stream=stream)
                self.bound.set()
                logger.info("bound to the assignments consumer", extra={"stream": stream, "consumer": durable})
                return psub
            except Exception as exc:
                failures += 1
                logger.warning("cannot bind the assignments consumer yet", extra={"error": repr(exc)})
                if isinstance(exc, nats.js.errors.NotFoundError) and failures % 5 == 0:
                    await self._reregister()  # the scheduler creates the consumer when a host registers
            await sleep_or_stop(stop, backoff_delay(failures, base_s=0.2, cap_s=5.0))
        return None

    async def _consume(self, js: JetStreamContext, stop: asyncio.Event) -> None:
        psub: JetStreamContext.PullSubscription | None = None
        failures = 0
        stopping = asyncio.ensure_future(stop.wait())
        try:
            while not stop.is_set():
                if psub is None:
                    psub = await self._bind(js, stop)
                    if psub is None:
                        break
                fetching = asyncio.ensure_future(psub.fetch(batch=max(len(self._queues), 1), timeout=FETCH_WAIT_S))
                await asyncio.wait({fetching, stopping}, return_when=asyncio.FIRST_COMPLETED)
                if not fetching.done():
                    fetching.cancel()
                    await asyncio.gather(fetching, return_exceptions=True)
                    break
                try:
                    msgs = fetching.result()
                except nats.errors.TimeoutError:
                    continue  # nothing to do: normal
                except Exception as exc:
                    failures += 1
                    logger.warning("fetching assignments failed", extra={"error": repr(exc), "failures": failures})
                    if isinstance(exc, nats.js.errors.NotFoundError) or failures >= 3:
                        with contextlib.suppress(Exception):
                            await psub.unsubscribe()
                        psub, failures = None, 0
                    await sleep_or_stop(stop, backoff_delay(max(failures, 1), base_s=0.2, cap_s=5.0))
                    continue
                failures = 0
                for msg in msgs:
                    await self._dispatch(msg)
        finally:
            stopping.cancel()
            if psub is not None:  # before draining: a pull subscription can hold a drain for its whole timeout
                with contextlib.suppress(Exception):
                    await psub.unsubscribe()

    def _remember(self, key: AttemptKey) -> bool:
        """Remember `key`; False if it was known already (a duplicate delivery)."""
        if key in self._known:
            return False
        self._known[key] = None
        while len(self._known) > REMEMBERED_ATTEMPTS:
            self._known.popitem(last=False)
        return True

    async def _dispatch(self, msg: Msg) -> None:
        try:
            assignment = decode(wire.Assignment, msg.data)
        except InvalidRequest as exc:
            logger.error("malformed assignment dropped", extra={"error": exc.message})
            await _settle(msg.term())
            return
        fields = {"task_id": str(assignment.task_id), "attempt": assignment.attempt, "device_id": assignment.device_id}
        queue = self._queues.get(assignment.device_id)
        if queue is None:
            # Its lease will expire and the sweeper requeues the task: better than failing the task here.
            logger.error("assignment for a device this host does not have", extra=fields)
            await _settle(msg.ack())
            return
        if not self._remember((str(assignment.task_id), assignment.attempt)):
            logger.info("duplicate assignment delivery dropped", extra=fields)
            await _settle(msg.ack())
            return
        keepalive = asyncio.create_task(self._keep_in_progress(msg))
        queue.put_nowait(_Delivery(msg, assignment, keepalive, time.monotonic()))

    async def _keep_in_progress(self, msg: Msg) -> None:
        while True:
            await asyncio.sleep(max(self.ack_wait_s / 3, 0.5))
            await _settle(msg.in_progress())

    async def _work(self, device: DeviceConfig) -> None:
        queue = self._queues[device.device_id]
        while True:
            delivery = await queue.get()
            task = asyncio.create_task(self._handle(device, delivery))
            self._attempt_tasks.add(task)
            try:
                await asyncio.shield(task)
            except Exception:
                logger.exception("attempt handling failed", extra={"device_id": device.device_id})
            finally:
                self._attempt_tasks.discard(task)
                delivery.keepalive.cancel()

    async def _handle(self, device: DeviceConfig, delivery: _Delivery) -> None:
        assert self._client is not None
        assert self._reporter is not None
        attempt = Attempt(
            delivery.assignment,
            device,
            client=self._client,
            reporter=self._reporter,
            registry=self.registry,
            stop_grace_s=self.config.stop_grace_s,
            request_timeout_s=self.config.request_timeout_s,
            received_at=delivery.received_at,
            workspace=self._workspace,
        )
        span = tracer().start_as_current_span(
            f"run attempt {delivery.assignment.attempt}",
            kind=SpanKind.CONSUMER,
            attributes={
                "devsched.task_id": str(delivery.assignment.task_id),
                "devsched.attempt": delivery.assignment.attempt,
            },
        )
        # continue the trace the assignment carries: claim, renewals and the report join the task's trace
        with use_context(extract(delivery.msg.headers)), span, bind(**attempt.log_fields()):
            if self._stopping.is_set():
                await _settle(delivery.msg.nak())
                return
            self._running[attempt.key] = attempt
            try:
                outcome = await attempt.claim(self._stopping)
                delivery.keepalive.cancel()
                if outcome is ClaimOutcome.CLAIMED:
                    self._reporter.kick()
                if outcome is ClaimOutcome.GAVE_UP and self._stopping.is_set():
                    await _settle(delivery.msg.nak())  # claimed by the next start, if still current
                    return
                await _settle(delivery.msg.ack())
                if outcome is not ClaimOutcome.CLAIMED:
                    return
                result = await attempt.run()
                spooled = await attempt.spool(result)
                # Deliver apart from this device's worker: a scheduler outage must not keep the device
                # from its next attempt (the scheduler reserves it again only once this one has ended).
                delivery_task = asyncio.create_task(self._deliver(spooled, attempt.log_fields()))
                self._report_tasks.add(delivery_task)
                delivery_task.add_done_callback(self._report_tasks.discard)
            finally:
                del self._running[attempt.key]

    async def _deliver(self, spooled: SpooledReport, fields: dict[str, object]) -> None:
        assert self._reporter is not None
        with bind(**fields):
            await self._reporter.deliver(spooled, give_up=self._give_up_reports)

    async def _on_nudge(self, msg: Msg) -> None:
        try:
            nudge = decode(wire.Nudge, msg.data)
        except InvalidRequest:
            return
        attempt = self._running.get((str(nudge.task_id), nudge.attempt))
        if attempt is not None:
            logger.info("nudged: renewing now", extra=attempt.log_fields())
            attempt.nudge()

    # -- shutdown ------------------------------------------------------------------------------------------

    async def _wait_attempts(self, seconds: float) -> bool:
        """Wait up to `seconds` for the running attempts (runs and reports); True when none is left."""
        pending = set(self._attempt_tasks) | set(self._report_tasks)
        if pending:
            await asyncio.wait(pending, timeout=seconds)
        return not any(not task.done() for task in pending)

    async def _shut_down(self) -> None:
        self._stopping.set()
        for queue in self._queues.values():
            while not queue.empty():
                delivery = queue.get_nowait()
                delivery.keepalive.cancel()
                await _settle(delivery.msg.nak())
        config = self.config
        if self._attempt_tasks or self._report_tasks:
            logger.info("shutting down: waiting for running attempts", extra={"grace_s": config.shutdown_grace_s})
        if await self._wait_attempts(config.shutdown_grace_s):
            return
        for attempt in list(self._running.values()):
            attempt.shut_down()
        if await self._wait_attempts(2 * config.stop_grace_s + config.request_timeout_s):
            return
        for attempt in list(self._running.values()):
            attempt.shut_down(kill=True)
        if await self._wait_attempts(config.stop_grace_s + config.request_timeout_s):
            return
        self._give_up_reports.set()  # what is not delivered now stays in the spool for the next start
        await self._wait_attempts(config.request_timeout_s + 1)


async def _settle(ack: Awaitable[None]) -> None:
    """Await an ack/nak/term/in_progress, ignoring failures: JetStream redelivers what was not settled."""
    with contextlib.suppress(Exception):
        await ack
