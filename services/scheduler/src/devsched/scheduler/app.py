"""The scheduler process: store, NATS, streams, loops and the service, started and stopped in order.

Shutdown (SIGTERM) runs the start in reverse: stop taking requests (other replicas get them), let the
ones in flight finish their transactions and replies, stop the loops, publish what they committed
(one last relay pass), drain the NATS connection, close the pool.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from contextlib import AsyncExitStack

import nats.errors
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.errors import APIError
from nats.micro.service import Service

from devsched.core.backoff import backoff_delay
from devsched.core.errors import DevschedError, StorageFull
from devsched.core.fairshare import PerDevice, ShareLimits
from devsched.protocol.endpoints import ENDPOINTS
from devsched.protocol.subjects import Subjects
from devsched.scheduler import budget
from devsched.scheduler.admission import Admission
from devsched.scheduler.api import Api
from devsched.scheduler.assigner import Assigner
from devsched.scheduler.health import add_checks
from devsched.scheduler.jetstream import JETSTREAM_ERRORS, ensure_host_streams, ensure_streams
from devsched.scheduler.loops import Wakeup, WorkLoop
from devsched.scheduler.metrics import DATABASE_GAUGES, READY, REGISTRY, Latencies, Stats, observe_store
from devsched.scheduler.relay import Relay
from devsched.scheduler.resync import Resync
from devsched.scheduler.service import Dispatcher, Lane, start_service, stop_taking_requests
from devsched.scheduler.settings import SchedulerSettings
from devsched.scheduler.warden import OutputWarden
from devsched.service import (
    Backoff,
    HealthServer,
    close_nats,
    connect_nats,
    flush_subscriptions,
    serving_health,
    sleep_or_stop,
)
from devsched.service.metrics import serve_metrics
from devsched.store import Committed, Store

log = logging.getLogger("devsched.scheduler")


class Scheduler:
    """One scheduler replica. `run(stop)` serves until `stop` is set; `ready` is set once serving."""

    def __init__(self, settings: SchedulerSettings) -> None:
        self.settings = settings
        self.subjects = Subjects(settings.subject_prefix)
        self.ready = asyncio.Event()
        self.assign_wakeup = Wakeup()
        self.relay_wakeup = Wakeup()
        self.admission = Admission(
            host_inbox_prefixes=settings.host_inbox_prefixes,
            operator_inbox_prefixes=settings.operator_inbox_prefixes,
            limits=ShareLimits(
                max_in_flight=settings.host_max_in_flight,
                rate_per_s=settings.host_rate_per_s,
                burst=settings.host_burst,
            ),
            per_device=PerDevice(
                in_flight=settings.host_max_in_flight_per_device,
                rate_per_s=settings.host_rate_per_device_per_s,
                burst=settings.host_burst_per_device,
            ),
        )
        self.dispatcher = Dispatcher(settings.max_concurrency, self.admission)
        self.relay: Relay | None = None
        self.assigner: Assigner | None = None
        self.resync: Resync | None = None
        #: Holds each host's log writes to its rate share (`warden.py`), when on.
        self.warden: OutputWarden | None = None
        #: What the readiness checks look at (`health.py`): set as `run` gets them.
        self.nc: Client | None = None
        self.store: Store | None = None
        self.service: Service | None = None
        #: True from the moment the endpoints serve until shutdown stops taking requests.
        self.taking_requests = False
        #: How many endpoints the micro service must list while it serves.
        self.endpoints_expected = 0
        #: The health endpoints, when `metrics_port` is set.
        self.health: HealthServer | None = None

    async def _streams(self, js: JetStreamContext, stop: asyncio.Event) -> bool:
        backoff = Backoff(base=0.2, cap=5.0)
        while not stop.is_set():
            try:
                refusal = await budget.check(js, self.settings)
                if refusal is not None:
                    raise budget.StoreTooSmall(refusal)
                await ensure_streams(js, self.subjects, self.settings)
                return True
            except JETSTREAM_ERRORS as exc:
                delay = backoff.next()
                log.warning("JetStream not ready: %s", type(exc).__name__, extra={"retry_in_s": delay})
                await sleep_or_stop(stop, delay)
        return False

    async def _host_streams(self, js: JetStreamContext, store: Store, stop: asyncio.Event) -> None:
        """Each online host's logs and uploads streams, in the background, until made (or `stop`).

        After an upgrade from the shared streams, agents that do not register again publish into them at once
        (a registration makes them too). The database may not answer yet at start: that is retried, never a
        reason to exit; a host JetStream has no room for is left to its next registration (refused 507).
        """
        for attempt in itertools.count(1):
            try:
                hosts = await store.list_hosts()
                for host in hosts:
                    if host.online:  # one gone for good keeps no share; it gets its streams when it registers
                        await ensure_host_streams(js, self.subjects, self.settings, host.host_id)
                return
            except StorageFull:
                log.warning("hosts' streams not all made: no room for one host more")
                return
            except (DevschedError, nats.errors.Error, APIError, TimeoutError) as exc:
                log.warning("hosts' streams not made yet, will retry: %s", type(exc).__name__)
            if await sleep_or_stop(stop, backoff_delay(attempt, base_s=1.0, cap_s=30.0)):
                return

    def _logs_closed(self) -> dict[str, float]:
        """The hosts whose logs stream the warden last saw closed, and until when (none when it is off)."""
        return self.warden.closed if self.warden is not None else {}

    async def _wake_from(self, nc: Client) -> None:
        async def on_wake(_: Msg) -> None:
            # the sweeper committed: requeued tasks to assign, its outbox rows to publish
            if self.assigner is not None:
                self.assigner.hint()
            if self.relay is not None:
                self.relay.request_full_pass()

        await nc.subscribe(self.subjects.internal_wake, cb=on_wake)

    async def run(self, stop: asyncio.Event) -> None:
        """Serve until `stop` is set, then shut down gracefully."""
        s = self.settings
        async with AsyncExitStack() as stack:
            self.health = await stack.enter_async_context(
                serving_health(s.metrics_host, s.metrics_port, service=self.subjects.service_name)
            )
            if self.health is not None:
                add_checks(self.health, self)
                serve_metrics(self.health, REGISTRY, ready=READY, component="scheduler")
            store = self.store = Store.connect(
                s.database_dsn,
                heartbeat_interval_s=s.heartbeat_interval_s,
                device_grace_s=s.device_grace_s,
                max_releases=s.max_releases,
                quarantine_after=s.quarantine_after,
                pool_size=s.db_pool_size,
                max_overflow=s.db_pool_size,
                assign_inline=s.assign_inline,
            )
            stack.push_async_callback(store.close)
            latencies: Latencies | None = None
            if self.health is not None:
                observe_store(store)
                latencies = Latencies()
            nc = self.nc = await connect_nats(
                s, name=f"{self.subjects.service_name}", stop=stop, drain_timeout_s=s.drain_timeout_s
            )
            stack.push_async_callback(close_nats, nc)
            if s.max_payload_bytes > nc.max_payload // 2:
                # A task view holds what several requests brought (plan, metadata, report): with requests this
                # close to the server's limit, one task may not fit any reply, even trimmed (docs/protocol.md).
                log.warning(
                    "DEVSCHED_MAX_PAYLOAD_BYTES is above half the NATS server's max_payload: some replies may not fit",
                    extra={"max_payload_bytes": s.max_payload_bytes, "server_max_payload": nc.max_payload},
                )
            js = nc.jetstream(timeout=s.publish_timeout_s)
            if s.create_streams:
                if not await self._streams(js, stop):
                    return
                made = asyncio.ensure_future(self._host_streams(js, store, stop))
                stack.callback(made.cancel)

            loops: list[WorkLoop] = []
            assigner = self.assigner = Assigner(store, self.assign_wakeup, batch=s.assign_batch, tick=s.assign_tick_s)
            loops.append(WorkLoop("assign", assigner.step, self.assign_wakeup, tick=s.assign_tick_s))
            relay: Relay | None = None
            if s.relay_enabled:
                relay = self.relay = Relay(store, js, self.subjects, s, self.relay_wakeup)
                loops.append(WorkLoop("relay", relay.step, self.relay_wakeup, tick=s.relay_tick_s))
                relay.start()
                stack.push_async_callback(relay.stop)
                if latencies is not None:
                    DATABASE_GAUGES.published = lambda: relay.published

            resync = self.resync = Resync(store, js, self.subjects, s)
            stack.push_async_callback(resync.stop)
            if s.resync_interval_s > 0:
                loops.append(WorkLoop("resync", resync.step, Wakeup(), tick=s.resync_interval_s))
            if s.create_streams and s.host_log_rate_interval_s > 0:
                warden = self.warden = OutputWarden(js, self.subjects, s.output_share)
                loops.append(WorkLoop("output-warden", warden.step, Wakeup(), tick=s.host_log_rate_interval_s))
            if s.health_pass_interval_s > 0:
                batch = s.health_pass_batch

                async def health_pass() -> bool:
                    due, placed = await store.health_pass(limit=batch)
                    return due >= batch or placed >= batch  # more at once

                loops.append(WorkLoop("health", health_pass, Wakeup(), tick=s.health_pass_interval_s))
            if latencies is not None:
                stats = Stats(store, latencies, grouping=s.metrics_grouping)
                loops.append(WorkLoop("metrics", stats.refresh, Wakeup(), tick=s.metrics_interval_s))

            def on_commit(committed: Committed) -> None:
                if relay is not None:
                    relay.offer(committed)  # published at once; without a relay, the table keeps it
                assigner.on_commit(committed)
                if latencies is not None:
                    latencies.on_commit(committed)

            store.on_commit = on_commit
            for loop in loops:
                loop.start()

            # The relay hears of every commit from the store: a request's wake-up would only cost it a pass.
            api = Api(
                store,
                nc,
                js,
                self.subjects,
                s,
                assign_wakeup=self.assign_wakeup,
                relay_wakeup=Wakeup(),
                on_registered=resync.host_registered,
                on_devices=self.admission.registered,
                logs_closed=self._logs_closed,
            )
            service = self.service = await start_service(
                nc,
                api,
                self.subjects,
                self.dispatcher,
                max_payload_bytes=s.max_payload_bytes,
                commit_lane=Lane(limit=s.artifact_commit_slots, per_host=s.artifact_commits_per_host),
            )
            await self._wake_from(nc)
            await flush_subscriptions(nc)
            log.info(
                "serving",
                extra={"service": self.subjects.service_name, "instance": service.id, "prefix": s.subject_prefix},
            )
            self.endpoints_expected = len(ENDPOINTS)
            self.taking_requests = True
            self.ready.set()

            await stop.wait()
            self.taking_requests = False
            log.info("stopping: no new requests", extra={"in_flight": self.dispatcher.in_flight})
            try:
                await asyncio.wait_for(stop_taking_requests(nc, service), timeout=s.drain_timeout_s)
            except TimeoutError:  # NATS is away: nothing more can reach us anyway
                log.warning("endpoints not drained in time", extra={"timeout_s": s.drain_timeout_s})
            if not await self.dispatcher.wait_idle(s.shutdown_grace_s):
                log.warning(
                    "requests still in flight after the grace period", extra={"in_flight": self.dispatcher.in_flight}
                )
            for loop in loops:
                await loop.stop()
            store.on_commit = None
            if self.relay is not None:
                await self._last_relay_pass()
            log.info("stopped")

    async def _last_relay_pass(self) -> None:
        """Publish what the last requests committed, and mark it, so it does not wait for another replica."""
        assert self.relay is not None
        try:
            await asyncio.wait_for(self.relay.stop(), timeout=self.settings.publish_timeout_s)
            await asyncio.wait_for(self.relay.step(), timeout=self.settings.publish_timeout_s)
        except Exception as exc:  # left for the next relay: nothing is lost
            log.info("final relay pass skipped: %s", type(exc).__name__)
