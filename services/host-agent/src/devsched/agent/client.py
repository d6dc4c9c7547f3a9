"""The host's side of the scheduler's host endpoints: `P.host.<host_id>.<verb>`, one method per verb.

Every call is one try (no retries here): the caller knows whether and when to repeat, and the lease
keeper needs the send time of the very try that succeeded. Error replies raise the typed errors of
`devsched.core.errors`; no reply raises `NoReply` (retryable). A claim or renewal answers with core's
`Extension`, the grant as the scheduler's store decided it: the rest of the agent never sees the wire's.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from typing import Any, TypeVar

import nats.errors
from nats.aio.client import Client
from pydantic import BaseModel

from devsched.agent.spool import report_key
from devsched.core.errors import BY_CODE, DevschedError, Internal, InvalidRequest
from devsched.core.leases import Extension
from devsched.protocol.codec import decode, raise_for_error
from devsched.protocol.endpoints import (
    HOST_CLAIM,
    HOST_HEARTBEAT,
    HOST_REGISTER,
    HOST_RELEASE,
    HOST_RENEW,
    HOST_RENEWALS,
    HOST_REPORT,
    HOST_REPORTS,
    Endpoint,
)
from devsched.protocol.messages import (
    ActionOffer,
    ClaimRequest,
    DeviceRegistration,
    ErrorDetail,
    HeartbeatRequest,
    LeaseReply,
    Progress,
    RegisterReply,
    RegisterRequest,
    ReleaseReply,
    RenewalOutcome,
    RenewalsRequest,
    RenewRequest,
    ReportOutcome,
    ReportReply,
)
from devsched.protocol.subjects import Subjects
from devsched.protocol.tracing import inject, send_span, unsampled
from devsched.protocol.transport import NoReply, request

log = logging.getLogger(__name__)

Q = TypeVar("Q", bound=BaseModel)
P = TypeVar("P", bound=BaseModel)


def _granted(reply: LeaseReply) -> Extension:
    """The grant a claim or renewal reply carries (`dispatch`, the store's own flag, is not on the wire)."""
    return Extension(
        expires_at=reply.expires_at, ttl_s=reply.ttl_s, cancel_requested=reply.cancel_requested, stop=reply.stop
    )


def _refused(error: ErrorDetail) -> DevschedError:
    """The typed error of one entry's `error` in a batch's reply, as its own request's error reply would raise.

    The class comes from core's `BY_CODE`, as for an error reply; a code this version does not know is
    `Internal` (transient: the keeper or the reporter retries it).
    """
    err = BY_CODE.get(error.code, Internal)(error.message)
    err.details = dict(error.details)
    return err


def renewal_answer(outcome: RenewalOutcome) -> Extension | DevschedError:
    """One lease's answer in a `renewals` reply: its grant, or the error `renew` would have raised for it.

    An unknown code is `Internal`: the keeper retries it, and the lease's deadline still bounds the retries.
    """
    if outcome.error is not None:
        return _refused(outcome.error)
    if outcome.expires_at is None or outcome.ttl_s is None:
        return Internal("a renewals outcome with neither a grant nor an error")
    return Extension(
        expires_at=outcome.expires_at, ttl_s=outcome.ttl_s, cancel_requested=outcome.cancel_requested, stop=outcome.stop
    )


def report_answer(outcome: ReportOutcome) -> ReportReply | DevschedError:
    """One report's answer in a `reports` reply: its reply, or the error `report` would have raised for it."""
    if outcome.error is not None:
        return _refused(outcome.error)
    if outcome.status is None or outcome.recorded_at is None:
        return Internal("a reports outcome with neither a reply nor an error")
    return ReportReply(
        task_id=outcome.task_id, attempt=outcome.attempt, status=outcome.status, recorded_at=outcome.recorded_at,
        duplicate=outcome.duplicate, next=outcome.next,
    )  # fmt: skip


def reports_body(bodies: Sequence[bytes]) -> bytes:
    """The `reports` request of encoded reports: each entry the very bytes of its `report`, as spooled."""
    return b'{"reports":[' + b",".join(bodies) + b"]}"


class HostClient:
    """Typed requests of one host over one NATS connection."""

    def __init__(self, nc: Client, subjects: Subjects, host_id: str, *, timeout_s: float) -> None:
        self._nc = nc
        self._subjects = subjects
        self.host_id = host_id
        self.timeout_s = timeout_s
        #: Whether the scheduler's latest register or heartbeat reply said a claim may carry progress
        #: (an older scheduler's says nothing: it would refuse the field).
        self.claim_progress = False
        #: Whether it said a report may take the device's next attempt (`take_next`; an older one would refuse it).
        self.take_next = False
        #: Whether it said it serves `renewals` (several leases in one request; an older one does not).
        self.renewals = False
        #: Whether it said it serves `reports` (several reports in one request; an older one does not).
        self.reports = False

    def _subject(self, endpoint: Endpoint[Any, Any]) -> str:
        return self._subjects.endpoint(endpoint, self.host_id)

    async def _call(self, endpoint: Endpoint[Q, P], body: Q, timeout_s: float) -> P:
        return await request(self._nc, self._subject(endpoint), body, endpoint.reply, timeout=timeout_s)

    async def register(
        self,
        devices: list[DeviceRegistration],
        agent_version: str | None,
        actions: list[ActionOffer] | None = None,
    ) -> RegisterReply:
        """Replace this host's device list (and its actions); the reply gives the heartbeat interval.

        A scheduler that predates plug-ins refuses `actions` as an unknown field: the host then registers
        without them (it gets tasks of built-in actions only) and says so once.
        """
        body = RegisterRequest(devices=devices, agent_version=agent_version, actions=actions)
        try:
            reply = await self._call(HOST_REGISTER, body, self.timeout_s)
        except InvalidRequest as exc:
            if actions is None or not any(e.get("path") == "actions" for e in exc.details.get("errors", [])):
                raise
            log.warning("the scheduler does not take advertised actions: registered without them (built-ins only)")
            body = RegisterRequest(devices=devices, agent_version=agent_version)
            reply = await self._call(HOST_REGISTER, body, self.timeout_s)
        self._learn(reply)
        return reply

    def _learn(self, reply: RegisterReply) -> None:
        """What the scheduler's register or heartbeat reply says it takes."""
        self.claim_progress = reply.claim_progress
        self.take_next = reply.take_next
        self.renewals = reply.renewals
        self.reports = reply.reports

    async def heartbeat(self) -> RegisterReply:
        """A sign of life; the reply gives the heartbeat interval.

        Not traced (`unsampled`), here or in the scheduler: an idle host would export a trace every interval.
        """
        with unsampled():
            reply = await self._call(HOST_HEARTBEAT, HeartbeatRequest(), self.timeout_s)
        self._learn(reply)
        return reply

    async def claim(
        self,
        task_id: uuid.UUID,
        attempt: int,
        lease_id: uuid.UUID,
        progress: Progress | None = None,
        *,
        timeout_s: float,
    ) -> Extension:
        """Start an assigned attempt (a repeat for the same lease is answered as a renewal).

        `progress` (the first step's, only when `claim_progress`) stands in for that step's boundary renewal.
        """
        body = ClaimRequest(task_id=task_id, attempt=attempt, lease_id=lease_id, progress=progress)
        return _granted(await self._call(HOST_CLAIM, body, timeout_s))

    async def renew(
        self,
        task_id: uuid.UUID,
        attempt: int,
        lease_id: uuid.UUID,
        progress: Progress | None,
        *,
        timeout_s: float,
    ) -> Extension:
        """Extend the lease, carrying `progress`."""
        body = RenewRequest(task_id=task_id, attempt=attempt, lease_id=lease_id, progress=progress)
        return _granted(await self._call(HOST_RENEW, body, timeout_s))

    async def renew_several(
        self, leases: Sequence[RenewRequest], *, timeout_s: float
    ) -> list[Extension | DevschedError]:
        """Renew several leases in one `renewals` request (only when `renewals`); each one's answer, in order.

        Raises:
            DevschedError: the typed error of an error reply for the request as a whole.
            NoReply: no reply in time, or nothing serves the subject (an older scheduler).
            Internal: the reply does not answer the leases asked, in their order.
        """
        reply = await self._call(HOST_RENEWALS, RenewalsRequest(leases=list(leases)), timeout_s)
        if [(o.task_id, o.attempt) for o in reply.leases] != [(lease.task_id, lease.attempt) for lease in leases]:
            raise Internal("a renewals reply that does not answer the leases asked, in their order")
        return [renewal_answer(outcome) for outcome in reply.leases]

    async def report(self, body: bytes) -> ReportReply:
        """Send an encoded report exactly as spooled, so every retry carries the identical bytes.

        Raises:
            DevschedError: the typed error of an error reply.
            NoReply: no reply in time, or nothing serves the subject.
        """
        return await self._send_spooled(HOST_REPORT, body)

    async def report_several(self, bodies: Sequence[bytes]) -> list[tuple[str, ReportReply | DevschedError]]:
        """Send encoded reports in one `reports` request (only when `reports`); each one's answer, in order.

        Each answer comes with the spool key of the attempt it names (`spool.report_key`), for the caller
        to check against what it sent.

        Raises:
            DevschedError: the typed error of an error reply for the request as a whole.
            NoReply: no reply in time, or nothing serves the subject (an older scheduler).
        """
        reply = await self._send_spooled(HOST_REPORTS, reports_body(bodies))
        return [(report_key(str(o.task_id), o.attempt), report_answer(o)) for o in reply.reports]

    async def release(self, body: bytes) -> ReleaseReply:
        """Send an encoded release exactly as spooled (see `report`)."""
        return await self._send_spooled(HOST_RELEASE, body)

    async def _send_spooled(self, endpoint: Endpoint[Any, P], body: bytes) -> P:
        reply_type = endpoint.reply
        subject = self._subject(endpoint)
        with send_span(subject, len(body)):
            try:
                msg = await self._nc.request(subject, body, timeout=self.timeout_s, headers=inject() or None)
            except (nats.errors.TimeoutError, nats.errors.NoRespondersError) as exc:
                reason = "timeout" if isinstance(exc, nats.errors.TimeoutError) else "no_responders"
                raise NoReply(f"no reply from {subject}: {reason}", subject=subject, reason=reason) from exc
            raise_for_error(msg.headers, msg.data)
        try:
            return decode(reply_type, msg.data)
        except InvalidRequest as exc:
            raise Internal(f"malformed {reply_type.__name__} from {subject}", **exc.details) from exc
