from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import cast

import pytest

from devsched.agent.client import HostClient
from devsched.agent.reporter import MAX_NOT_FOUND, REMOVAL_WINDOW_S, Reporter, encode_report
from devsched.agent.spool import Spool
from devsched.core.errors import (
    CancelNotRequested,
    InvalidRequest,
    LeaseExpired,
    NotFound,
    OutcomeConflict,
    Unavailable,
)
from devsched.core.status import Outcome, TaskStatus
from devsched.protocol import messages as m
from devsched.protocol.codec import encode
from devsched.protocol.transport import NoReply

pytestmark = pytest.mark.unit

TASK, LEASE = uuid.UUID(int=1), uuid.UUID(int=2)


def report(tail: str = "ok", steps: int = 1) -> m.ReportRequest:
    results = [
        m.StepResult(name=f"s{i}", status=m.StepStatus.DONE, exit_code=0, output_tail=tail) for i in range(steps)
    ]
    return m.ReportRequest(
        task_id=TASK, attempt=1, lease_id=LEASE, outcome=Outcome.DONE, result=m.RunResult(steps=results)
    )


class FakeClient:
    """Answers reports (and releases) from a script: an exception to raise, or None for a recorded reply."""

    def __init__(self, *answers: Exception | None) -> None:
        self.answers = list(answers)
        self.bodies: list[bytes] = []
        self.released: list[bytes] = []

    async def release(self, body: bytes) -> m.ReleaseReply:
        self.released.append(body)
        answer = self.answers.pop(0) if self.answers else None
        if answer is not None:
            raise answer
        return m.ReleaseReply(task_id=TASK, attempt=1, status=TaskStatus.QUEUED, recorded_at=datetime.now(UTC))

    async def report(self, body: bytes) -> m.ReportReply:
        self.bodies.append(body)
        answer = self.answers.pop(0) if self.answers else None
        if answer is not None:
            raise answer
        return m.ReportReply(task_id=TASK, attempt=1, status=TaskStatus.DONE, recorded_at=datetime.now(UTC))


def reporter(client: FakeClient, spool: Spool, **options: object) -> Reporter:
    return Reporter(cast(HostClient, client), spool, base_backoff_s=0.001, max_backoff_s=0.01, **options)  # type: ignore[arg-type]


async def test_a_recorded_report_leaves_the_spool(tmp_path: Path) -> None:
    spool, client = Spool(tmp_path), FakeClient(None)
    sender = reporter(client, spool)
    spooled = await sender.store(report())
    assert spool.pending()[0].body == spooled.body == encode(report())
    reply = await sender.deliver(spooled)
    assert reply is not None
    assert spool.pending() == []


async def test_transient_failures_are_retried_with_identical_bytes(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    client = FakeClient(NoReply(), Unavailable(), ConnectionError(), None)
    sender = reporter(client, spool)
    assert await sender.deliver(await sender.store(report())) is not None
    assert len(client.bodies) == 4
    assert len(set(client.bodies)) == 1
    assert spool.pending() == []


@pytest.mark.parametrize("error", [LeaseExpired(), OutcomeConflict()])
async def test_a_conflict_makes_the_report_moot(tmp_path: Path, error: Exception) -> None:
    spool = Spool(tmp_path)
    sender = reporter(FakeClient(error), spool)
    assert await sender.deliver(await sender.store(report())) is None
    assert spool.pending() == []
    assert not (tmp_path / "rejected").exists()


@pytest.mark.parametrize("error", [InvalidRequest("bad"), CancelNotRequested()])
async def test_a_report_that_can_never_be_accepted_is_kept_aside(tmp_path: Path, error: Exception) -> None:
    spool = Spool(tmp_path)
    sender = reporter(FakeClient(error), spool)
    assert await sender.deliver(await sender.store(report())) is None
    assert spool.pending() == []
    assert (tmp_path / "rejected" / f"{TASK}.1.json").read_bytes() == encode(report())


async def test_not_found_re_registers_then_gives_up(tmp_path: Path) -> None:
    registrations: list[int] = []

    async def register() -> None:
        registrations.append(1)

    spool = Spool(tmp_path)
    sender = reporter(FakeClient(*[NotFound()] * MAX_NOT_FOUND), spool, on_not_found=register)
    assert await sender.deliver(await sender.store(report())) is None
    assert len(registrations) == MAX_NOT_FOUND - 1
    assert (tmp_path / "rejected" / f"{TASK}.1.json").exists()


async def test_not_found_once_then_recorded_after_re_registration(tmp_path: Path) -> None:
    spool = Spool(tmp_path)

    async def register() -> None:
        return None

    sender = reporter(FakeClient(NotFound(), None), spool, on_not_found=register)
    assert await sender.deliver(await sender.store(report())) is not None


async def test_giving_up_leaves_the_report_spooled(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    give_up = asyncio.Event()
    client = FakeClient(*[NoReply()] * 1000)
    sender = reporter(client, spool)
    delivering = asyncio.create_task(sender.deliver(await sender.store(report()), give_up=give_up))
    await asyncio.sleep(0.05)
    give_up.set()
    assert await asyncio.wait_for(delivering, 10) is None
    assert [p.key for p in spool.pending()] == [f"{TASK}.1"]


async def test_a_report_that_cannot_be_spooled_is_still_sent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spool, client = Spool(tmp_path), FakeClient(None)

    def broken(key: str, body: bytes) -> Path:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(spool, "put", broken)
    sender = reporter(client, spool)
    spooled = await sender.store(report())
    assert spooled.path is None
    assert await sender.deliver(spooled) is not None
    assert client.bodies == [encode(report())]


def test_a_report_too_large_gets_shorter_tails() -> None:
    big = report(tail="x" * 4096, steps=100)
    assert len(encode(big)) > 300_000
    body = encode_report(big, limit=100_000)
    assert len(body) <= 100_000
    small = m.ReportRequest.model_validate_json(body)
    assert small.result is not None
    assert len(small.result.steps) == 100
    assert all(0 < len(s.output_tail or "") < 4096 for s in small.result.steps)
    assert encode_report(report()) == encode(report())


def test_an_oversized_report_drops_listed_failing_tests_after_output_but_keeps_the_counts() -> None:
    failed = [m.FailedTest(name="n" * 512, classname="c" * 512, message="m" * 1024) for _ in range(20)]
    summary = m.ResultsSummary(format="junit", tests=500, failures=20, errors=3, skipped=1, failed=failed)
    steps = [
        m.StepResult(name=f"s{i}", status=m.StepStatus.FAILED, exit_code=1, output_tail="x" * 4096, results=summary)
        for i in range(100)
    ]
    big = m.ReportRequest(
        task_id=TASK, attempt=1, lease_id=LEASE, outcome=Outcome.FAILED, result=m.RunResult(steps=steps)
    )
    assert len(encode(big)) > 4_000_000
    body = encode_report(big, limit=512 * 1024)
    assert len(body) <= 512 * 1024
    small = m.ReportRequest.model_validate_json(body)
    assert small.result is not None
    assert all(s.output_tail == "" for s in small.result.steps)  # output goes first
    for step in small.result.steps:
        assert step.results is not None
        assert (step.results.tests, step.results.failures, step.results.errors) == (500, 20, 3)
        assert 0 < len(step.results.failed) < 20
        assert step.results.failed == failed[: len(step.results.failed)]  # the first ones, whole


def release(reason: str = "agent shutting down") -> m.ReleaseRequest:
    return m.ReleaseRequest(task_id=TASK, attempt=1, lease_id=LEASE, reason=reason)


async def test_a_release_is_spooled_under_its_own_key_and_sent_as_a_release(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    client = FakeClient(NoReply(), None)
    sender = reporter(client, spool)
    spooled = await sender.store_release(release())
    (pending,) = spool.pending()
    assert (pending.key, pending.is_release, pending.attempt_key) == (f"{TASK}.1.release", True, f"{TASK}.1")
    assert pending.body == encode(release())
    reply = await sender.deliver(spooled)
    assert isinstance(reply, m.ReleaseReply)
    assert client.bodies == [], "a release never goes to the report endpoint"
    assert client.released == [encode(release())] * 2
    assert spool.pending() == []


@pytest.mark.parametrize("error", [LeaseExpired(), OutcomeConflict()])
async def test_a_release_answered_with_a_conflict_is_moot(tmp_path: Path, error: Exception) -> None:
    spool = Spool(tmp_path)
    sender = reporter(FakeClient(error), spool)
    assert await sender.deliver(await sender.store_release(release())) is None
    assert spool.pending() == []
    assert not (tmp_path / "rejected").exists()


async def test_a_release_left_at_shutdown_stays_spooled(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    give_up = asyncio.Event()
    give_up.set()
    sender = reporter(FakeClient(Unavailable()), spool)
    assert await sender.deliver(await sender.store_release(release()), give_up=give_up) is None
    assert [p.key for p in spool.pending()] == [f"{TASK}.1.release"]


async def test_reports_answered_together_leave_the_spool_in_one_removal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spool = Spool(tmp_path)
    sender = reporter(FakeClient(), spool)
    spooled = [sender.put_now(f"{uuid.UUID(int=100 + i)}.1", encode(report())) for i in range(5)]
    batches: list[list[str]] = []
    remove_all = spool.remove_all

    def counted(keys: list[str]) -> None:
        batches.append(list(keys))
        remove_all(keys)

    monkeypatch.setattr(spool, "remove_all", counted)
    replies = await asyncio.gather(*(sender.deliver(s) for s in spooled))
    assert all(reply is not None for reply in replies)
    assert spool.pending() == []
    assert sorted(k for batch in batches for k in batch) == sorted(s.key for s in spooled)
    assert len(batches) < len(spooled), "those answered while a removal ran share the next one"


async def test_reports_answered_within_a_window_of_the_last_removal_share_the_next(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spool = Spool(tmp_path)
    sender = reporter(FakeClient(), spool)
    spooled = [sender.put_now(f"{uuid.UUID(int=100 + i)}.1", encode(report())) for i in range(3)]
    batches: list[list[str]] = []
    remove_all = spool.remove_all

    def counted(keys: list[str]) -> None:
        batches.append(list(keys))
        remove_all(keys)

    monkeypatch.setattr(spool, "remove_all", counted)

    async def deliver_later(index: int) -> object:
        await asyncio.sleep(index * REMOVAL_WINDOW_S / 10)  # answered one after the other, not at once
        return await sender.deliver(spooled[index])

    replies = await asyncio.gather(*(deliver_later(i) for i in range(len(spooled))))
    assert all(reply is not None for reply in replies)
    assert spool.pending() == []
    first, *rest = [s.key for s in spooled]
    assert batches == [[first], rest], "the first at once, the next two (within the window) in one removal"


async def test_a_failed_removal_is_raised_to_the_deliverer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spool = Spool(tmp_path)
    sender = reporter(FakeClient(None), spool)
    spooled = await sender.store(report())

    def broken(keys: list[str]) -> None:
        raise PermissionError("read-only spool")

    monkeypatch.setattr(spool, "remove_all", broken)
    with pytest.raises(PermissionError):
        await sender.deliver(spooled)
    assert [p.key for p in spool.pending()] == [spooled.key]
