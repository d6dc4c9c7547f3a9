"""A stand-in for the scheduler's host side over real NATS: endpoints, streams, consumers, a lease table.

Enough of the protocol to drive the agent through claim, renew, nudge, report and release without a database:
each attempt is a row with its lease, status and whether a cancellation is pending.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import nats.micro
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig, StreamConfig
from nats.micro.service import Service

from devsched.core.errors import (
    Internal,
    InvalidRequest,
    LeaseExpired,
    LeaseSuperseded,
    NotFound,
    OutcomeConflict,
    TaskTerminal,
    Unavailable,
)
from devsched.core.status import TaskStatus
from devsched.protocol import endpoints
from devsched.protocol import messages as m
from devsched.protocol.codec import encode
from devsched.protocol.subjects import MSG_ID_HEADER, HostVerb, Subjects, assignment_msg_id
from devsched.protocol.transport import add_typed_endpoint


@dataclass
class Row:
    """One attempt as the fake scheduler keeps it."""

    host_id: str
    assignment: m.Assignment
    status: str = "assigned"
    cancel_requested: bool = False
    claims: int = 0
    claimed_at: datetime | None = None
    progress: list[m.Progress | None] = field(default_factory=list)
    #: The progress each claim carried.
    claimed_with: list[m.Progress | None] = field(default_factory=list)
    reports: list[m.ReportRequest] = field(default_factory=list)
    releases: list[m.ReleaseRequest] = field(default_factory=list)
    recorded_at: datetime | None = None
    #: The attempt this attempt's report handed over (`take_next`), to hand again to a repeat.
    handed: m.HandedAttempt | None = None


class FakeScheduler:
    """The host endpoints plus the assignments stream, on `subjects`."""

    def __init__(self, nc: Client, subjects: Subjects, *, ttl_s: int = 30, heartbeat_interval_s: float = 0.5) -> None:
        self.nc = nc
        self.js = nc.jetstream()
        self.subjects = subjects
        self.ttl_s = ttl_s
        self.heartbeat_interval_s = heartbeat_interval_s
        self.rows: dict[tuple[uuid.UUID, int], Row] = {}
        self.registrations: list[tuple[str, m.RegisterRequest]] = []
        self.heartbeats = 0
        self.report_bodies: list[bytes] = []
        #: Answer this many reports with 503 before accepting one.
        self.fail_reports = 0
        #: Answer reports with 500 `internal` (a scheduler failing on them) while true.
        self.internal_reports = False
        #: Answer renewals with 409 lease_expired.
        self.reject_renewals = False
        #: Say in register and heartbeat replies that a claim may carry progress.
        self.claim_progress = False
        #: Answer a claim with progress 400, as a scheduler that does not know the field does.
        self.refuse_claim_progress = False
        #: Say in register and heartbeat replies that a report may take the next attempt.
        self.take_next = False
        #: Answer a report with `take_next` 400, as a scheduler that does not know the field does.
        self.refuse_take_next = False
        #: Attempts a report taking the next attempt hands over, first first (`hand_next`).
        self.to_hand: list[Row] = []
        #: Record this many reports, then answer them 503 as if their replies were lost.
        self.lose_report_replies = 0
        self._service: Service | None = None

    async def start(self) -> None:
        await self.js.add_stream(
            StreamConfig(
                name=self.subjects.assignments_stream, subjects=[self.subjects.assign_all], duplicate_window=120
            )
        )
        self._service = await nats.micro.add_service(
            self.nc, name=self.subjects.service_name, version="0.0.0", queue_group=self.subjects.queue_group
        )
        served = [
            (endpoints.HOST_REGISTER, self.register),
            (endpoints.HOST_HEARTBEAT, self.heartbeat),
            (endpoints.HOST_CLAIM, self.claim),
            (endpoints.HOST_RENEW, self.renew),
            (endpoints.HOST_REPORT, self.report),
            (endpoints.HOST_RELEASE, self.release),
        ]
        for endpoint, handler in served:
            await add_typed_endpoint(
                self._service,
                name=endpoint.name,
                subject=self.subjects.served(endpoint),
                request_type=endpoint.request,
                handler=handler,  # type: ignore[arg-type]
            )
        # Report bodies as sent, byte for byte (the service answers; this only listens).
        await self.nc.subscribe(self.subjects.served(endpoints.HOST_REPORT), cb=self._record_body)

    async def stop(self) -> None:
        if self._service is not None:
            await self._service.stop()
        await self.js.delete_stream(self.subjects.assignments_stream)

    async def _record_body(self, msg: Msg) -> None:
        self.report_bodies.append(msg.data)

    # -- endpoints ------------------------------------------------------------------------------------------

    async def register(self, req: m.RegisterRequest, subject: str) -> m.RegisterReply:
        host_id = self.subjects.host_id_of(subject)
        self.registrations.append((host_id, req))
        name = self.subjects.consumer(host_id)
        await self.js.add_consumer(
            self.subjects.assignments_stream,
            ConsumerConfig(
                name=name,
                durable_name=name,
                filter_subject=self.subjects.assign(host_id),
                ack_policy=AckPolicy.EXPLICIT,
                ack_wait=2.0,
            ),
        )
        return m.RegisterReply(
            heartbeat_interval_s=self.heartbeat_interval_s, claim_progress=self.claim_progress, take_next=self.take_next
        )

    async def heartbeat(self, req: m.HeartbeatRequest, subject: str) -> m.RegisterReply:
        self.heartbeats += 1
        return m.RegisterReply(
            heartbeat_interval_s=self.heartbeat_interval_s, claim_progress=self.claim_progress, take_next=self.take_next
        )

    def _host_reply(self) -> m.RegisterReply:
        return m.RegisterReply(
            heartbeat_interval_s=self.heartbeat_interval_s, claim_progress=self.claim_progress, take_next=self.take_next
        )

    def _row(self, req: m.LeaseRequest, subject: str) -> Row:
        row = self.rows.get((req.task_id, req.attempt))
        if row is None or row.host_id != self.subjects.host_id_of(subject):
            raise NotFound("no such task")
        if row.assignment.lease_id != req.lease_id:
            raise LeaseSuperseded()
        if row.status == "expired":
            raise LeaseExpired()
        return row

    def _lease(self, row: Row) -> m.LeaseReply:
        return m.LeaseReply(
            expires_at=datetime.now(UTC) + timedelta(seconds=self.ttl_s),
            ttl_s=self.ttl_s,
            cancel_requested=row.cancel_requested,
        )

    async def claim(self, req: m.ClaimRequest, subject: str) -> m.LeaseReply:
        if req.progress is not None and self.refuse_claim_progress:
            raise InvalidRequest("invalid request", errors=[{"path": "progress", "message": "Extra inputs"}])
        row = self._row(req, subject)
        if row.status not in ("assigned", "dispatched"):
            raise TaskTerminal()
        row.claims += 1
        row.claimed_with.append(req.progress)
        row.status = "dispatched"
        row.claimed_at = row.claimed_at or datetime.now(UTC)
        return self._lease(row)

    async def renew(self, req: m.RenewRequest, subject: str) -> m.LeaseReply:
        row = self._row(req, subject)
        if self.reject_renewals:
            row.status = "expired"
            raise LeaseExpired()
        if row.status not in ("assigned", "dispatched"):
            raise TaskTerminal()
        row.progress.append(req.progress)
        return self._lease(row)

    async def report(self, req: m.ReportRequest, subject: str) -> m.ReportReply:
        if self.internal_reports:
            raise Internal()
        if self.fail_reports > 0:
            self.fail_reports -= 1
            raise Unavailable()
        if req.take_next and self.refuse_take_next:
            raise InvalidRequest("invalid request", errors=[{"path": "take_next", "message": "Extra inputs"}])
        row = self._row(req, subject)
        row.reports.append(req)
        if row.status in ("done", "failed", "cancelled"):
            if row.status != req.outcome.value:
                raise OutcomeConflict()
            duplicate = True
        else:
            row.status, row.recorded_at, duplicate = req.outcome.value, datetime.now(UTC), False
            if req.take_next and self.to_hand:
                handed = self.to_hand.pop(0)
                handed.status, handed.claimed_at = "dispatched", datetime.now(UTC)
                a = handed.assignment
                row.handed = m.HandedAttempt(
                    task_id=a.task_id, attempt=a.attempt, lease_id=a.lease_id, device_id=a.device_id, plan=a.plan,
                    ttl_s=self.ttl_s, expires_at=datetime.now(UTC) + timedelta(seconds=self.ttl_s),
                    cancel_requested=handed.cancel_requested,
                )  # fmt: skip
        assert row.recorded_at is not None
        if self.lose_report_replies > 0:
            self.lose_report_replies -= 1
            raise Unavailable()
        return m.ReportReply(
            task_id=req.task_id,
            attempt=req.attempt,
            status=TaskStatus(row.status),
            recorded_at=row.recorded_at,
            duplicate=duplicate,
            next=row.handed if req.take_next else None,
        )

    async def release(self, req: m.ReleaseRequest, subject: str) -> m.ReleaseReply:
        row = self._row(req, subject)
        row.releases.append(req)
        if row.status == "released":
            duplicate = True
        elif row.status in ("assigned", "dispatched"):
            row.status, row.recorded_at, duplicate = "released", datetime.now(UTC), False
        else:
            raise OutcomeConflict()
        assert row.recorded_at is not None
        return m.ReleaseReply(
            task_id=req.task_id,
            attempt=req.attempt,
            status=TaskStatus.QUEUED,
            recorded_at=row.recorded_at,
            duplicate=duplicate,
        )

    # -- driving the agent --------------------------------------------------------------------------------

    async def assign(
        self,
        host_id: str,
        device_id: str,
        steps: list[m.Step],
        *,
        msg_id: bool = True,
        attempt: int = 1,
        status: str = "assigned",
        cancel_requested: bool = False,
    ) -> Row:
        """Create an attempt and publish its assignment (`cancel_requested`: a cancellation already pending)."""
        assignment = m.Assignment(
            task_id=uuid.uuid4(),
            attempt=attempt,
            lease_id=uuid.uuid4(),
            device_id=device_id,
            plan=m.Plan(steps=steps),
            ttl_s=self.ttl_s,
            expires_at=datetime.now(UTC) + timedelta(seconds=self.ttl_s),
        )
        row = Row(host_id, assignment, status=status, cancel_requested=cancel_requested)
        self.rows[(assignment.task_id, assignment.attempt)] = row
        await self.publish(row, msg_id=msg_id)
        return row

    def hand_next(self, host_id: str, device_id: str, steps: list[m.Step], *, cancel_requested: bool = False) -> Row:
        """Create an attempt that the next report taking it (`take_next`) hands over; nothing is published."""
        assignment = m.Assignment(
            task_id=uuid.uuid4(),
            attempt=1,
            lease_id=uuid.uuid4(),
            device_id=device_id,
            plan=m.Plan(steps=steps),
            ttl_s=self.ttl_s,
            expires_at=datetime.now(UTC) + timedelta(seconds=self.ttl_s),
        )
        row = Row(host_id, assignment, cancel_requested=cancel_requested)
        self.rows[(assignment.task_id, assignment.attempt)] = row
        self.to_hand.append(row)
        return row

    async def publish(self, row: Row, *, msg_id: bool = True) -> None:
        """Publish `row`'s assignment (again)."""
        a = row.assignment
        headers = {MSG_ID_HEADER: assignment_msg_id(a.task_id, a.attempt)} if msg_id else None
        await self.js.publish(self.subjects.assign(row.host_id), encode(a), headers=headers)

    async def cancel(self, row: Row) -> None:
        """Record a cancellation request and nudge the host, as the scheduler does."""
        row.cancel_requested = True
        a = row.assignment
        await self.nc.publish(
            self.subjects.host(row.host_id, HostVerb.NUDGE), encode(m.Nudge(task_id=a.task_id, attempt=a.attempt))
        )
