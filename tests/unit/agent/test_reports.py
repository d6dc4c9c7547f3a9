"""The report batcher: coalescing, splitting by count and bytes, per-report answers, whole-request failures
and the fallback, with a fake client standing in for the scheduler (pure logic: no NATS); and through the
reporter, each report's answer handled as a `report`'s (spool removal, moot, rejected, hand-over)."""

from __future__ import annotations

import asyncio
import contextvars
import json
import uuid
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import cast

import pytest

from devsched.agent.client import HostClient, report_answer, reports_body
from devsched.agent.reporter import Reporter
from devsched.agent.reports import ReportBatcher
from devsched.agent.spool import Spool, report_key
from devsched.core.errors import (
    CancelNotRequested,
    DevschedError,
    Internal,
    InvalidRequest,
    LeaseExpired,
    LeaseForeign,
    NotFound,
    OutcomeConflict,
    TooManyRequests,
    Unavailable,
)
from devsched.core.limits import MAX_REPORTS_PER_REQUEST
from devsched.core.status import TaskStatus
from devsched.protocol import messages as m
from devsched.protocol.codec import decode, encode
from devsched.protocol.transport import NoReply
from support.polling import eventually

pytestmark = pytest.mark.unit

Answer = m.ReportReply | DevschedError

#: Stands for a sender's context (its attempt's trace and log fields): each request should carry its sender's.
SENDER = contextvars.ContextVar("sender", default="nobody")


def report(attempt: int = 1, task_id: uuid.UUID | None = None, **fields: object) -> m.ReportRequest:
    return m.ReportRequest.model_validate(
        {"task_id": task_id or uuid.uuid4(), "attempt": attempt, "lease_id": uuid.uuid4(), "outcome": "done", **fields}
    )


def keyed(req: m.ReportRequest) -> tuple[str, bytes]:
    return report_key(str(req.task_id), req.attempt), encode(req)


def recorded(req: m.ReportRequest) -> Answer:
    """Recorded: the status names the attempt (1 done, else failed), so each caller can tell its own answer."""
    status = TaskStatus.DONE if req.attempt == 1 else TaskStatus.FAILED
    return m.ReportReply(task_id=req.task_id, attempt=req.attempt, status=status, recorded_at=datetime.now(UTC))


class FakeClient:
    """Answers `reports` and `report` per report with `answer`; or fails, or holds a request until `gate` opens."""

    def __init__(self, answer: Callable[[m.ReportRequest], Answer] = recorded) -> None:
        self.reports = True
        self.answer = answer
        self.fail: BaseException | None = None
        self.gate: asyncio.Event | None = None
        self.batches: list[list[bytes]] = []
        self.singles: list[bytes] = []
        self.swap = False
        #: The sender's context each request was sent in (`SENDER`), in order.
        self.senders: list[str] = []

    async def report_several(self, bodies: Sequence[bytes]) -> list[tuple[str, Answer]]:
        self.batches.append(list(bodies))
        self.senders.append(SENDER.get())
        decode(m.ReportsRequest, reports_body(bodies))  # a request the scheduler takes
        if self.gate is not None:
            await self.gate.wait()
        if self.fail is not None:
            raise self.fail
        answered = [keyed_answer(decode(m.ReportRequest, body), self.answer) for body in bodies]
        return answered[::-1] if self.swap else answered

    async def report(self, body: bytes) -> m.ReportReply:
        self.singles.append(body)
        self.senders.append(SENDER.get())
        answer = self.answer(decode(m.ReportRequest, body))
        if isinstance(answer, DevschedError):
            raise answer
        return answer


def keyed_answer(req: m.ReportRequest, answer: Callable[[m.ReportRequest], Answer]) -> tuple[str, Answer]:
    return report_key(str(req.task_id), req.attempt), answer(req)


async def settle(results: list[asyncio.Task[m.ReportReply]]) -> list[m.ReportReply | BaseException]:
    async with asyncio.timeout(5):
        return await asyncio.gather(*results, return_exceptions=True)


def spawn(batcher: ReportBatcher, reports: Sequence[m.ReportRequest]) -> list[asyncio.Task[m.ReportReply]]:
    return [asyncio.create_task(batcher.report(*keyed(one))) for one in reports]


def statuses(answers: list[m.ReportReply | BaseException]) -> list[object]:
    return [a.status if isinstance(a, m.ReportReply) else type(a) for a in answers]


async def test_reports_of_one_loop_turn_go_in_one_request_each_answered_its_own() -> None:
    client = FakeClient()
    batcher = ReportBatcher(client)
    reports = [report(attempt) for attempt in (1, 2, 1, 2)]
    answers = await settle(spawn(batcher, reports))
    assert client.batches == [[encode(r) for r in reports]], "each entry is the report's own bytes"
    assert [(a.task_id, a.attempt) for a in answers if isinstance(a, m.ReportReply)] == [
        (r.task_id, r.attempt) for r in reports
    ]
    assert statuses(answers) == [TaskStatus.DONE, TaskStatus.FAILED, TaskStatus.DONE, TaskStatus.FAILED]
    assert client.singles == []


async def test_a_lone_report_goes_out_as_a_report_at_once() -> None:
    client = FakeClient()
    batcher = ReportBatcher(client)
    async with asyncio.timeout(0.5):  # no timer holds it back
        assert (await batcher.report(*keyed(report()))).status == TaskStatus.DONE
    assert (client.batches, len(client.singles)) == ([], 1)


async def test_reports_sent_while_one_request_is_in_flight_go_together_after_it() -> None:
    client = FakeClient()
    client.gate = asyncio.Event()
    batcher = ReportBatcher(client)
    first = spawn(batcher, [report(), report()])
    await eventually(lambda: client.batches, interval=0.001, message="the first request out")
    later = [report() for _ in range(3)]
    waiting = spawn(batcher, later[:1])
    await asyncio.sleep(0.01)  # in another loop turn than the rest
    waiting += spawn(batcher, later[1:])
    await asyncio.sleep(0.01)
    assert len(client.batches) == 1, "nothing more goes out while the first is in flight"
    client.gate.set()
    answers = await settle(first + waiting)
    assert [len(batch) for batch in client.batches] == [2, 3]
    assert client.batches[1] == [encode(r) for r in later]
    assert statuses(answers) == [TaskStatus.DONE] * 5


async def test_a_batch_is_split_at_its_largest_count_and_at_the_payload_limit() -> None:
    client = FakeClient()
    reports = [report() for _ in range(7)]
    answers = await settle(spawn(ReportBatcher(client, max_batch=3), reports))
    assert [len(batch) for batch in client.batches] == [3, 3]
    assert len(client.singles) == 1, "the last one alone goes as a report"
    assert statuses(answers) == [TaskStatus.DONE] * 7

    client = FakeClient()
    size = len(encode(reports[0]))
    answers = await settle(spawn(ReportBatcher(client, max_bytes=20 + 3 * (size + 1)), reports[:6]))
    assert [len(batch) for batch in client.batches] == [3, 3]
    assert all(len(reports_body(batch)) <= 20 + 3 * (size + 1) for batch in client.batches)
    assert statuses(answers) == [TaskStatus.DONE] * 6


def test_a_batch_size_beyond_the_protocols_is_refused() -> None:
    with pytest.raises(ValueError, match="max_batch"):
        ReportBatcher(FakeClient(), max_batch=MAX_REPORTS_PER_REQUEST + 1)


async def test_a_report_refused_in_a_batch_fails_alone_with_its_own_error() -> None:
    refused = report()
    client = FakeClient(lambda req: LeaseForeign("not yours") if req.task_id == refused.task_id else recorded(req))
    answers = await settle(spawn(ReportBatcher(client), [report(), refused, report(2)]))
    assert statuses(answers) == [TaskStatus.DONE, LeaseForeign, TaskStatus.FAILED]
    assert len(client.batches) == 1


async def test_the_same_attempt_twice_waits_for_the_next_batch() -> None:
    client = FakeClient()
    twice = report()
    answers = await settle(spawn(ReportBatcher(client), [twice, report(), twice]))
    assert [len(batch) for batch in client.batches] == [2]
    assert client.singles == [encode(twice)], "the repeat goes after, alone"
    assert statuses(answers) == [TaskStatus.DONE] * 3


@pytest.mark.parametrize(
    ("failure", "raised"),
    [
        (Unavailable("down"), Unavailable),
        (Internal("bug"), Internal),
        (TooManyRequests("slow down"), TooManyRequests),
        (NoReply("no reply", reason="timeout"), NoReply),
        (OutcomeConflict("not for the request as a whole"), Unavailable),
        (RuntimeError("connection closed"), Unavailable),
    ],
)
async def test_a_failed_request_is_a_transient_error_for_each_report(
    failure: BaseException, raised: type[DevschedError]
) -> None:
    client = FakeClient()
    client.fail = failure
    answers = await settle(spawn(ReportBatcher(client), [report(), report()]))
    assert [type(a) for a in answers] == [raised, raised], "never one that ends or rejects a report"
    assert client.singles == []
    assert client.reports is True


@pytest.mark.parametrize("failure", [NoReply("nothing serves it", reason="no_responders"), NotFound("no such")])
async def test_unserved_reports_fall_back_to_one_report_each_until_told_again(failure: BaseException) -> None:
    client = FakeClient()
    client.fail = failure
    batcher = ReportBatcher(client)
    answers = await settle(spawn(batcher, [report(), report(2)]))
    assert statuses(answers) == [TaskStatus.DONE, TaskStatus.FAILED]
    assert (len(client.batches), len(client.singles), client.reports) == (1, 2, False)
    await settle(spawn(batcher, [report(), report()]))
    assert (len(client.batches), len(client.singles)) == (1, 4), "one by one from then on"


async def test_a_request_refused_whole_as_invalid_sends_each_report_alone() -> None:
    client = FakeClient()
    client.fail = InvalidRequest("an entry the scheduler refuses")
    answers = await settle(spawn(ReportBatcher(client), [report(), report()]))
    assert statuses(answers) == [TaskStatus.DONE] * 2
    assert (len(client.singles), client.reports) == (2, True)


async def test_a_reply_answering_other_reports_is_an_internal_error_for_each() -> None:
    client = FakeClient()
    client.swap = True
    answers = await settle(spawn(ReportBatcher(client), [report(), report()]))
    assert [type(a) for a in answers] == [Internal, Internal]


async def test_without_the_flag_each_report_goes_alone() -> None:
    client = FakeClient()
    client.reports = False
    answers = await settle(spawn(ReportBatcher(client), [report(), report()]))
    assert statuses(answers) == [TaskStatus.DONE] * 2
    assert (client.batches, len(client.singles)) == ([], 2)


def test_an_outcome_is_the_reply_or_the_error_report_would_answer() -> None:
    task, lease = uuid.uuid4(), uuid.uuid4()
    error = m.ErrorDetail(code="lease_expired", message="too late", details={"k": 1})
    refused = report_answer(m.ReportOutcome(task_id=task, attempt=2, lease_id=lease, error=error))
    assert isinstance(refused, LeaseExpired)
    assert (refused.message, refused.details) == ("too late", {"k": 1})
    unknown = m.ErrorDetail(code="from_the_future", message="?")
    assert isinstance(report_answer(m.ReportOutcome(task_id=task, attempt=2, lease_id=lease, error=unknown)), Internal)
    assert isinstance(report_answer(m.ReportOutcome(task_id=task, attempt=2, lease_id=lease)), Internal)
    at = datetime.now(UTC)
    reply = report_answer(
        m.ReportOutcome(task_id=task, attempt=2, lease_id=lease, status=TaskStatus.DONE, recorded_at=at, duplicate=True)
    )
    assert reply == m.ReportReply(task_id=task, attempt=2, status=TaskStatus.DONE, recorded_at=at, duplicate=True)


def test_a_reports_body_is_the_reports_bytes_in_a_list() -> None:
    reports = [report(), report(2, take_next=True)]
    body = reports_body([encode(r) for r in reports])
    assert json.loads(body) == {"reports": [json.loads(encode(r)) for r in reports]}
    assert decode(m.ReportsRequest, body).reports == reports


async def test_through_the_reporter_each_answer_is_handled_as_a_reports(tmp_path: Path) -> None:
    """Recorded and duplicate leave the spool, a hand-over is taken first, moot leaves, never-acceptable is
    kept aside: each as its own `report`'s answer would be, from one `reports` request."""
    done, dup, moot, bad = report(), report(), report(), report(outcome="cancelled")
    handed = decode(m.HandedAttempt, json.dumps({
        "task_id": str(uuid.uuid4()), "attempt": 1, "lease_id": str(uuid.uuid4()), "device_id": "d1",
        "plan": {"steps": [{"name": "s", "action": "shell", "args": {"command": "true"}}]},
        "ttl_s": 30, "expires_at": datetime.now(UTC).isoformat(),
    }).encode())  # fmt: skip

    def answer(req: m.ReportRequest) -> Answer:
        if req.task_id == moot.task_id:
            return LeaseExpired("gone")
        if req.task_id == bad.task_id:
            return CancelNotRequested("no cancellation was asked")
        reply = recorded(req)
        assert isinstance(reply, m.ReportReply)
        if req.task_id == done.task_id:
            return reply.model_copy(update={"next": handed})
        return reply.model_copy(update={"duplicate": True})

    client = FakeClient(answer)
    spool = Spool(tmp_path)
    sender = Reporter(cast(HostClient, client), spool, batcher=ReportBatcher(client))
    taken: list[m.HandedAttempt] = []

    async def on_answer(reply: m.ReportReply | m.ReleaseReply, sent_at: float) -> None:
        assert [r.key for r in spool.pending()], "taken before the report leaves the spool"
        if isinstance(reply, m.ReportReply) and reply.next is not None:
            taken.append(reply.next)

    spooled = [await sender.store(r) for r in (done, dup, moot, bad)]
    async with asyncio.timeout(5):
        replies = await asyncio.gather(*(sender.deliver(s, answered=on_answer) for s in spooled))
    assert len(client.batches) == 1
    assert client.singles == []
    assert [r.duplicate if r is not None else None for r in replies] == [False, True, None, None]
    assert taken == [handed]
    assert spool.pending() == []
    assert [p.stem for p in (tmp_path / "rejected").iterdir() if p.suffix == ".json"] == [spooled[3].key]


async def test_each_request_is_sent_in_its_senders_context() -> None:
    """A report sent alone carries its own attempt's trace; a batch carries its first report's."""

    async def sent_by(batcher: ReportBatcher, sender: str, req: m.ReportRequest) -> m.ReportReply:
        SENDER.set(sender)
        return await batcher.report(*keyed(req))

    client = FakeClient()
    batcher = ReportBatcher(client)
    senders = ["first", "second", "third"]
    await settle([asyncio.create_task(sent_by(batcher, who, report())) for who in senders])
    assert client.senders == ["first"]
    client.senders.clear()
    client.fail = NoReply("nothing serves it", reason="no_responders")
    await settle([asyncio.create_task(sent_by(batcher, who, report())) for who in senders])
    assert client.senders == ["first", *senders], "the failed batch, then each report in its own context"
