"""The endpoint handlers: each takes a validated request model and returns a reply model.

Each maps onto one store call (one transaction). Typed errors propagate to `devsched.protocol`'s
`typed_handler`, which turns them into error replies; `_protocol_error` is the one place where errors
that are not `DevschedError`s (JetStream's) become protocol errors.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, TypeVar

from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError
from pydantic import BaseModel

from devsched.core.actions import action_labels
from devsched.core.errors import DevschedError, Internal, InvalidRequest, Unavailable
from devsched.core.leases import Extension
from devsched.core.records import LeaseRef
from devsched.core.records import Selector as CoreSelector
from devsched.protocol import endpoints
from devsched.protocol import messages as m
from devsched.protocol.codec import encode, refusal_log_fields
from devsched.protocol.endpoints import handles
from devsched.protocol.subjects import HostVerb, Subjects
from devsched.protocol.tracing import inject
from devsched.protocol.transport import reply_limit
from devsched.scheduler.artifacts import ArtifactIntake
from devsched.scheduler.jetstream import (
    JETSTREAM_ERRORS,
    ensure_host_consumer,
    ensure_host_streams,
    ensure_streams,
)
from devsched.scheduler.loops import Wakeup
from devsched.scheduler.metrics import Replies
from devsched.scheduler.plugin_args import check_offers, check_plugin_args
from devsched.scheduler.replies import fit, fit_reports, list_item, size, trim_view
from devsched.scheduler.settings import SchedulerSettings
from devsched.service import bind
from devsched.store import ActionSpec, DeviceSpec, HostReport, NewTask, ReportReceipt, Store, task_cursor
from devsched.store.outbox import trace_headers

log = logging.getLogger("devsched.scheduler.api")

Req = TypeVar("Req", bound=BaseModel)
Rep = TypeVar("Rep", bound=BaseModel)

#: Host request subjects whose host id is remembered (least recently used forgotten first): 4 verbs a host.
HOST_SUBJECTS_CACHED = 16384


def _protocol_error(exc: Exception) -> DevschedError | None:
    """The protocol error for `exc`; the one place where errors from outside devsched get a code."""
    if isinstance(exc, DevschedError):
        return exc
    if isinstance(exc, JETSTREAM_ERRORS):
        return Unavailable(f"NATS JetStream is unavailable: {type(exc).__name__}")
    return None  # a bug: `typed_handler` logs it and answers 500 without details


def observed(name: str, handler: Callable[[Req, str], Awaitable[Rep]]) -> Callable[[Req, str], Awaitable[Rep]]:
    """Wrap a handler: carry the request's trace into outbox rows, translate errors, log refusals, count replies.

    Handlers log what happened (submitted, claimed, reported, ...) at INFO, once; this wrapper adds a
    DEBUG line with the time taken, and one line for every refusal (INFO for 4xx, WARNING for 5xx) with its
    code, status and field paths, never its message. Replies are counted by code (`metrics.Replies`). One
    wrapper, not one per concern: each layer of coroutine costs every request its frame and its await.
    """
    replies = Replies(name)

    async def run(req: Req, subject: str) -> Rep:
        started = time.perf_counter()
        token = trace_headers.set(inject({}) or None)
        try:
            with bind(endpoint=name):
                try:
                    reply = await handler(req, subject)
                except Exception as exc:
                    err = _protocol_error(exc)
                    if err is None:
                        replies.failed(exc)
                        raise
                    replies.failed(err)
                    level = logging.WARNING if err.status >= 500 else logging.INFO
                    # Code, status and field paths only: a message may quote the submitted value.
                    log.log(level, "%s refused", name, extra=refusal_log_fields(err))
                    if err is exc:
                        raise
                    raise err from exc
                replies.ok()
                if log.isEnabledFor(logging.DEBUG):  # not even the extra's dict on every request otherwise
                    log.debug("%s ok", name, extra={"ms": round((time.perf_counter() - started) * 1000, 2)})
                return reply
        finally:
            trace_headers.reset(token)

    return run


def _new_task(req: m.SubmitRequest) -> NewTask:
    """The store's submit value of a validated request (plan normalised with its defaults)."""
    return NewTask(
        plan=req.plan.model_dump(mode="json"),
        name=req.name,
        # The plan's plug-in actions join the selector as reserved labels: only a host offering them matches.
        selector=CoreSelector(
            labels={**req.selector.labels, **action_labels(req.plan.actions())}, device_id=req.selector.device_id
        ),
        priority=req.priority,
        max_attempts=req.max_attempts,
        lease_ttl_s=req.lease_ttl_s,
        idempotency_key=req.idempotency_key,
        metadata=dict(req.metadata),
        retry=req.retry.to_core() if req.retry is not None else None,
        queue_timeout_s=req.queue_timeout_s,
        attempt_timeout_s=req.attempt_timeout_s,
        deadline=req.deadline,
    )


def _action_specs(offers: Sequence[m.ActionOffer]) -> list[ActionSpec]:
    """The store's value of a registration's actions (their schemas checked first: `plugin_args.check_offers`)."""
    return [ActionSpec(offer.name, offer.version, offer.args_schema) for offer in offers]


#: The replies of `renew`, by code: a lease renewed in a `renewals` request counts there too.
_RENEWED = Replies(endpoints.HOST_RENEW.name)


def _renewal_outcome(ref: LeaseRef, answer: Extension | DevschedError) -> m.RenewalOutcome:
    """One lease's entry in a `renewals` reply: the grant, or the error `renew` would have answered."""
    if isinstance(answer, DevschedError):
        error = m.ErrorDetail(code=answer.code, message=answer.message, details=answer.details)
        return m.RenewalOutcome(task_id=ref.task_id, attempt=ref.attempt, lease_id=ref.lease_id, error=error)
    return m.RenewalOutcome(
        task_id=ref.task_id, attempt=ref.attempt, lease_id=ref.lease_id, expires_at=answer.expires_at,
        ttl_s=answer.ttl_s, cancel_requested=answer.cancel_requested, stop=answer.stop,
    )  # fmt: skip


#: The replies of `report`, by code: a report answered in a `reports` request counts there too.
_REPORTED = Replies(endpoints.HOST_REPORT.name)


def _result_of(req: m.ReportRequest | m.ReleaseRequest) -> dict[str, Any] | None:
    """The report's test results as the store keeps them (JSON values)."""
    return req.result.model_dump(mode="json") if req.result is not None else None


def _report_outcome(req: m.ReportRequest, answer: m.ReportReply | DevschedError) -> m.ReportOutcome:
    """One report's entry in a `reports` reply: the reply, or the error `report` would have answered."""
    if isinstance(answer, DevschedError):
        error = m.ErrorDetail(code=answer.code, message=answer.message, details=answer.details)
        return m.ReportOutcome(task_id=req.task_id, attempt=req.attempt, lease_id=req.lease_id, error=error)
    return m.ReportOutcome(
        task_id=req.task_id, attempt=req.attempt, lease_id=req.lease_id, status=answer.status,
        recorded_at=answer.recorded_at, duplicate=answer.duplicate, next=answer.next,
    )  # fmt: skip


def _host_reply(heartbeat_interval_s: float) -> m.RegisterReply:
    """The register and heartbeat reply: the interval and what this scheduler takes.

    A claim may carry the first step's progress, and a report may take the device's next attempt (`take_next`).
    """
    return m.RegisterReply(
        heartbeat_interval_s=heartbeat_interval_s, claim_progress=True, take_next=True, renewals=True, reports=True
    )


class Api:
    """The scheduler's endpoints over the store."""

    def __init__(
        self,
        store: Store,
        nc: Client,
        js: JetStreamContext,
        subjects: Subjects,
        settings: SchedulerSettings,
        *,
        assign_wakeup: Wakeup,
        relay_wakeup: Wakeup,
        on_registered: Callable[[str], None] | None = None,
        on_devices: Callable[[str, int], None] | None = None,
        logs_closed: Callable[[], Mapping[str, float]] | None = None,
    ) -> None:
        self._store = store
        #: Told of how many devices each host registered (its fair share grows with them).
        self._on_devices = on_devices
        #: The hosts whose logs stream is closed for their output rate, and until when (`warden.py`).
        self._logs_closed = logs_closed
        #: Told of each host whose registration listed devices, once its consumer exists (the resync).
        self._on_registered = on_registered
        self._nc = nc
        self._js = js
        self._subjects = subjects
        self._settings = settings
        self._assign = assign_wakeup
        self._relay = relay_wakeup
        self._artifacts = ArtifactIntake(store, nc, js, subjects, settings)
        #: `subjects.host_id_of`, remembered per subject: the admission and the handler each parse every
        #: host request's subject (a split, an enum and a token check; issue 10), and a host has few subjects.
        self.host_id_of: Callable[[str], str] = functools.lru_cache(maxsize=HOST_SUBJECTS_CACHED)(subjects.host_id_of)

    def _host_of(self, subject: str) -> str:
        try:
            return self.host_id_of(subject)
        except ValueError as exc:
            raise InvalidRequest(str(exc), errors=[{"path": "", "message": f"subject: {exc}"}]) from None

    def _lease(self, subject: str, req: m.LeaseRequest) -> LeaseRef:
        return LeaseRef(host_id=self._host_of(subject), task_id=req.task_id, attempt=req.attempt, lease_id=req.lease_id)

    # -- operators and clients ---------------------------------------------------------------

    @handles(endpoints.TASKS_SUBMIT)
    async def submit(self, req: m.SubmitRequest, subject: str) -> m.SubmitReply:
        """`P.api.tasks.submit`."""
        await check_plugin_args(self._store, req.plan)
        done = await self._store.submit(_new_task(req))
        if done.created:
            self._relay.set()
            self._assign.set()
        with bind(task_id=done.task_id):
            log.info("submitted" if done.created else "submit repeated", extra={"new": done.created})
        return m.SubmitReply.from_value(done)

    @handles(endpoints.TASKS_GET)
    async def get(self, req: m.GetTaskRequest, subject: str) -> m.TaskView:
        """`P.api.tasks.get`."""
        with bind(task_id=req.task_id):
            view = await self._store.get_task(req.task_id)
            artifacts = await self._store.list_artifacts(req.task_id)  # issue 12: the view lists them
            reply = m.TaskView.from_value(dataclasses.replace(view, artifacts=artifacts) if artifacts else view)
            budget = reply_limit(self._nc)
            if size(reply) <= budget:
                return reply
            reply = trim_view(reply, budget, req.full or ())
            log.info("task view trimmed to fit a reply", extra={"fields": reply.truncated})
            return reply

    @handles(endpoints.TASKS_ARTIFACTS)
    async def artifacts(self, req: m.ListArtifactsRequest, subject: str) -> m.ListArtifactsReply:
        """`P.api.tasks.artifacts` (an addition, issue 12): a task's stored artifacts."""
        with bind(task_id=req.task_id):
            return await self._artifacts.list(req, reply_limit(self._nc))

    @handles(endpoints.HOST_ARTIFACT)
    async def artifact(self, req: m.ArtifactCommit, subject: str) -> m.ArtifactView:
        """`P.host.<id>.artifact` (an addition, issue 12): store an uploaded file (`devsched.scheduler.artifacts`)."""
        return await self._artifacts.commit(self._host_of(subject), req)

    @handles(endpoints.TASKS_LIST)
    async def list(self, req: m.ListTasksRequest, subject: str) -> m.ListTasksReply:
        """`P.api.tasks.list`: a page cut by bytes too (`devsched.scheduler.replies`), its large fields cut."""
        page = await self._store.list_tasks(
            status=req.status,
            limit=req.limit,
            after=req.after,
            kind=req.kind,
            device_id=req.device_id,
            id_prefix=req.id_prefix,
        )
        tasks = [list_item(m.TaskSummary.from_value(task)) for task in page.tasks]
        n = fit(tasks, reply_limit(self._nc))
        if n == len(tasks):
            return m.ListTasksReply(tasks=tasks, next=page.next)
        last = page.tasks[n - 1]
        return m.ListTasksReply(tasks=tasks[:n], next=task_cursor(last.created_at, last.task_id))

    @handles(endpoints.TASKS_CANCEL)
    async def cancel(self, req: m.CancelRequest, subject: str) -> m.CancelReply:
        """`P.api.tasks.cancel`; nudges the host when work is in flight there."""
        with bind(task_id=req.task_id):
            receipt = await self._store.request_cancel(req.task_id, req.reason)
            self._relay.set()
            log.info(
                "cancel requested" if receipt.cancel_requested else "cancel answered",
                extra={"task_status": receipt.status.value},
            )
            if receipt.cancel_requested and receipt.nudge is not None:
                await self._nudge(*receipt.nudge, task_id=req.task_id)
            return m.CancelReply.from_value(receipt)

    async def _nudge(self, host_id: str, attempt: int, *, task_id: object) -> None:
        body = encode(m.Nudge.model_validate({"task_id": task_id, "attempt": attempt}))
        try:
            await self._nc.publish(self._subjects.host(host_id, HostVerb.NUDGE), body, headers=inject({}) or None)
        except Exception as exc:  # best effort: the next renewal carries the cancellation anyway
            log.info("nudge not sent: %s", type(exc).__name__, extra={"host_id": host_id, "attempt": attempt})
        else:
            log.info("nudged", extra={"host_id": host_id, "attempt": attempt})

    @handles(endpoints.HOSTS_LIST)
    async def hosts(self, req: m.HostsListRequest, subject: str) -> m.HostsListReply:
        """`P.api.hosts.list`, by host id: cut to fit a reply, `next` naming the last host listed."""
        # Sorted here, not by the database's collation: `after` compares as Python does.
        listed = sorted(await self._store.list_hosts(), key=lambda h: h.host_id)
        hosts = [m.HostView.from_value(h) for h in listed if req.after is None or h.host_id > req.after]
        closed = self._logs_closed() if self._logs_closed is not None else {}
        if closed:
            hosts = [
                h.model_copy(update={"logs_closed_until": datetime.fromtimestamp(closed[h.host_id], UTC)})
                if h.host_id in closed
                else h
                for h in hosts
            ]
        n = fit(hosts, reply_limit(self._nc))
        return m.HostsListReply(hosts=hosts[:n], next=hosts[n - 1].host_id if n < len(hosts) else None)

    @handles(endpoints.DEVICES_DRAIN)
    async def drain(self, req: m.DrainRequest, subject: str) -> m.DeviceDrainView:
        """`P.api.devices.drain`."""
        view = await self._store.drain_device(req.device_id, req.drained, req.reason)
        if not view.drained:
            self._assign.set()
        log.info("drained" if view.drained else "returned to service", extra={"device_id": view.device_id})
        return m.DeviceDrainView.from_value(view)

    @handles(endpoints.DEVICES_FORGET)
    async def forget(self, req: m.ForgetDeviceRequest, subject: str) -> m.DeviceForgottenView:
        """`P.api.devices.forget` (an addition): free a device from its host; the audit record says so."""
        freed = await self._store.forget_device(req.device_id, req.reason)
        log.warning(
            "device forgotten: the next host that registers it owns it",
            extra={
                "device_id": freed.device_id,
                "host_id": freed.host_id,
                "actor": freed.actor,
                "audit_id": freed.audit_id,
            },
        )
        return m.DeviceForgottenView.from_value(freed)

    @handles(endpoints.DEVICES_LABEL)
    async def label(self, req: m.LabelDeviceRequest, subject: str) -> m.DeviceDrainView:
        """`P.api.devices.label` (an addition): pin or unpin operator labels (the keys are logged, no value)."""
        view = await self._store.label_device(req.device_id, req.labels, req.unset)
        self._assign.set()
        log.info(
            "device labelled by operator",
            extra={
                "device_id": view.device_id,
                "pinned": " ".join(sorted(req.labels)),
                "unpinned": " ".join(sorted(req.unset)),
            },
        )
        return m.DeviceDrainView.from_value(view)

    # -- health checks (issue 13) -------------------------------------------------------------

    @handles(endpoints.HEALTH_SET)
    async def health_set(self, req: m.HealthCheckSetRequest, subject: str) -> m.HealthCheckView:
        """`P.api.health.set` (an addition): create or replace a health check."""
        await check_plugin_args(self._store, req.plan)
        view = await self._store.set_health_check(
            req.name, req.selector.labels, req.plan.model_dump(mode="json"), req.interval_s
        )
        log.info("health check set", extra={"check": view.name, "interval_s": view.interval_s})
        return m.HealthCheckView.from_value(view)

    @handles(endpoints.HEALTH_LIST)
    async def health_list(self, req: m.HealthCheckListRequest, subject: str) -> m.HealthCheckListReply:
        """`P.api.health.list` (an addition): the health checks in force."""
        checks = [
            m.HealthCheckView.from_value(c)
            for c in sorted(await self._store.list_health_checks(), key=lambda c: c.name)
            if req.after is None or c.name > req.after
        ]
        n = fit(checks, reply_limit(self._nc))
        return m.HealthCheckListReply(checks=checks[:n], next=checks[n - 1].name if n < len(checks) else None)

    @handles(endpoints.HEALTH_DELETE)
    async def health_delete(self, req: m.HealthCheckDeleteRequest, subject: str) -> m.HealthCheckView:
        """`P.api.health.delete` (an addition): remove a health check; answers the check removed."""
        view = await self._store.delete_health_check(req.name)
        log.info("health check removed", extra={"check": view.name})
        return m.HealthCheckView.from_value(view)

    # -- hosts ---------------------------------------------------------------------------------

    @handles(endpoints.HOST_REGISTER)
    async def register(self, req: m.RegisterRequest, subject: str) -> m.RegisterReply:
        """`P.host.<id>.register`: the host's streams, its devices, then its consumer (503 if JetStream fails).

        Then the host's unclaimed assignments are published again (in the background, best effort).
        """
        host_id = self._host_of(subject)
        with bind(host_id=host_id):
            devices = [DeviceSpec(d.device_id, dict(d.labels)) for d in req.devices]
            # A schema that breaks the rules refuses the registration (400 naming `actions.N.args_schema`):
            # the agent leaves out what it knows the scheduler refuses, so only a hostile host meets this.
            await check_offers(req.actions or ())
            actions = _action_specs(req.actions or ())
            # First its own logs and uploads streams, each its share of the budgets: 507 `storage_full` when
            # there is no room for one host more, and nothing registered (no device of it is given work).
            if self._settings.create_streams:  # else an operator makes them
                await ensure_host_streams(self._js, self._subjects, self._settings, host_id)
            interval = await self._store.register_host(host_id, devices, req.agent_version, actions)
            # After the commit: a registration refused by the store leaves no consumer behind; one whose
            # consumer fails is answered 503 and repeated by the agent (both steps are idempotent).
            try:
                await ensure_host_consumer(self._js, self._subjects, self._settings, host_id)
            except NotFoundError:  # the assignments stream was deleted under us
                if not self._settings.create_streams:
                    raise
                await ensure_streams(self._js, self._subjects, self._settings)
                await ensure_host_consumer(self._js, self._subjects, self._settings, host_id)
            if self._on_devices is not None:
                self._on_devices(host_id, len(devices))
            if devices and self._on_registered is not None:
                # Its unclaimed assignments, published again: the stream may have lost them while it was away.
                # Not for a withdrawal (no devices): that agent is stopping, and gives back what it holds.
                self._on_registered(host_id)
            self._assign.set()
            log.info("registered", extra={"devices": len(devices), "agent_version": req.agent_version})
            return _host_reply(interval)

    @handles(endpoints.HOST_HEARTBEAT)
    async def heartbeat(self, req: m.HeartbeatRequest, subject: str) -> m.HeartbeatReply:
        """`P.host.<id>.heartbeat`."""
        host_id = self._host_of(subject)
        with bind(host_id=host_id):
            return _host_reply(await self._store.heartbeat(host_id))

    @handles(endpoints.HOST_CLAIM)
    async def claim(self, req: m.ClaimRequest, subject: str) -> m.LeaseReply:
        """`P.host.<id>.claim`."""
        ref = self._lease(subject, req)
        with bind(host_id=ref.host_id, task_id=ref.task_id, attempt=ref.attempt, lease_id=ref.lease_id):
            progress = req.progress.model_dump(mode="json") if req.progress is not None else None
            grant = await self._store.claim(ref, progress)
            self._relay.set()
            log.info("claimed", extra={"cancel_requested": grant.cancel_requested})
            return m.LeaseReply.from_value(grant)

    @handles(endpoints.HOST_RENEW)
    async def renew(self, req: m.RenewRequest, subject: str) -> m.LeaseReply:
        """`P.host.<id>.renew`."""
        ref = self._lease(subject, req)
        with bind(host_id=ref.host_id, task_id=ref.task_id, attempt=ref.attempt, lease_id=ref.lease_id):
            progress = req.progress.model_dump(mode="json") if req.progress is not None else None
            grant = await self._store.renew(ref, progress)
            if progress is not None:
                self._relay.set()  # a new step is a `progress` event
            return m.LeaseReply.from_value(grant)

    @handles(endpoints.HOST_RENEWALS)
    async def renewals(self, req: m.RenewalsRequest, subject: str) -> m.RenewalsReply:
        """`P.host.<id>.renewals` (an addition): each lease renewed as `renew` would, in one request."""
        host_id = self._host_of(subject)
        leases = [
            (self._lease(subject, lease), lease.progress.model_dump(mode="json") if lease.progress else None)
            for lease in req.leases
        ]
        with bind(host_id=host_id):
            answers = await self._store.renewals(host_id, leases)
            if any(progress is not None for _, progress in leases):
                self._relay.set()  # a new step is a `progress` event
        for answer in answers:  # each lease counted as the reply of a `renew` of it would be
            if isinstance(answer, DevschedError):
                _RENEWED.failed(answer)
            else:
                _RENEWED.ok()
        outcomes = [_renewal_outcome(ref, answer) for (ref, _), answer in zip(leases, answers, strict=True)]
        return m.RenewalsReply(leases=outcomes)

    @handles(endpoints.HOST_REPORT)
    async def report(self, req: m.ReportRequest, subject: str) -> m.ReportReply:
        """`P.host.<id>.report`."""
        return await self._report(self._lease(subject, req), req)

    @handles(endpoints.HOST_REPORTS)
    async def reports(self, req: m.ReportsRequest, subject: str) -> m.ReportsReply:
        """`P.host.<id>.reports` (an addition): the reports applied together, each answered as `report` would.

        Group commit: the reports the store grants at once (`Store.reports`) commit in one transaction;
        each it leaves (a repeat, a conflict, a retry to decide) then goes through `report` on its own, all
        at once, and is answered with what `report` would have answered it (its reply or its error): a
        refused report changes nothing and the others are applied. Answered in order.
        """
        host_id = self._host_of(subject)
        refs = [
            LeaseRef(host_id=host_id, task_id=item.task_id, attempt=item.attempt, lease_id=item.lease_id)
            for item in req.reports
        ]
        batch = [
            HostReport(ref, item.outcome, item.reason, _result_of(item), item.take_next)
            for ref, item in zip(refs, req.reports, strict=True)
        ]
        together = await self._store.reports(host_id, batch) if len(batch) > 1 else [None] * len(batch)

        async def one(ref: LeaseRef, item: m.ReportRequest, receipt: ReportReceipt | None) -> m.ReportOutcome:
            try:
                reply = await self._report(ref, item, receipt)
            except Exception as exc:
                err = _protocol_error(exc)
                if err is None:  # a bug: answered as `report` would be (500), the other reports still applied
                    log.exception("report of a reports request failed", extra={"host_id": host_id})
                    err = Internal()
                _REPORTED.failed(err)
                level = logging.WARNING if err.status >= 500 else logging.INFO
                log.log(level, "report of a reports request refused", extra=refusal_log_fields(err))
                return _report_outcome(item, err)
            _REPORTED.ok()
            return _report_outcome(item, reply)

        answers = zip(refs, req.reports, together, strict=True)
        outcomes = list(await asyncio.gather(*(one(ref, item, receipt) for ref, item, receipt in answers)))
        return m.ReportsReply(reports=fit_reports(outcomes, reply_limit(self._nc)))

    async def _report(self, ref: LeaseRef, req: m.ReportRequest, receipt: ReportReceipt | None = None) -> m.ReportReply:
        """One report, as `report` and each entry of `reports` apply it (one transaction); `receipt` if applied."""
        with bind(host_id=ref.host_id, task_id=ref.task_id, attempt=ref.attempt, lease_id=ref.lease_id):
            if receipt is None:
                receipt = await self._store.report(
                    ref, req.outcome, reason=req.reason, result=_result_of(req), take_next=req.take_next
                )
            if not receipt.duplicate:
                self._relay.set()
                if receipt.next is None:
                    self._assign.set()  # the device is free again
            log.info("reported", extra={"outcome": req.outcome.value, "duplicate": receipt.duplicate})
            if receipt.next is not None:
                nxt = receipt.next
                log.info("handed over", extra={"next_task_id": nxt.task_id, "next_attempt": nxt.attempt})
            return m.ReportReply.from_value(receipt)

    @handles(endpoints.HOST_RELEASE)
    async def release(self, req: m.ReleaseRequest, subject: str) -> m.ReleaseReply:
        """`P.host.<id>.release` (an addition): the attempt is given back, its device free at once."""
        ref = self._lease(subject, req)
        with bind(host_id=ref.host_id, task_id=ref.task_id, attempt=ref.attempt, lease_id=ref.lease_id):
            receipt = await self._store.release(ref, reason=req.reason, result=_result_of(req))
            if not receipt.duplicate:
                self._relay.set()
                self._assign.set()  # the device is free, and the task is queued again
            log.info("released", extra={"task_status": receipt.status.value, "duplicate": receipt.duplicate})
            return m.ReleaseReply.from_value(receipt)

    @handles(endpoints.HOSTS_DRAIN)
    async def drain_host(self, req: m.HostDrainRequest, subject: str) -> m.HostView:
        """`P.api.hosts.drain` (an addition): drain the host's devices, and tell its agent to finish and exit."""
        with bind(host_id=req.host_id):
            view = await self._store.drain_host(req.host_id, req.drained, req.reason)
            if not req.drained:
                self._assign.set()
                log.info("host returned to service", extra={"devices": len(view.devices)})
                return m.HostView.from_value(view)
            notice = encode(m.DrainNotice(drain=True, reason=req.reason))
            try:
                await self._nc.publish(
                    self._subjects.host(req.host_id, HostVerb.NUDGE), notice, headers=inject({}) or None
                )
            except Exception as exc:  # the devices are drained anyway: the agent only finishes sooner
                log.warning("drain notice not sent: %s", type(exc).__name__)
            log.info("host drained", extra={"devices": len(view.devices)})
            return m.HostView.from_value(view)
