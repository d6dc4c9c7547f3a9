"""A report the scheduler keeps failing on (500) is retried for a bounded time, then parked in the spool.

An outage (no reply, 503) is waited out however long it lasts; only server errors park a report, and a
parked report is sent again when the agent starts again.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import cast

import pytest

from devsched.agent.attempt import release_of, to_wire
from devsched.agent.client import HostClient
from devsched.agent.config import ConfigError, parse_config
from devsched.agent.metrics import REGISTRY
from devsched.agent.reporter import Reporter, is_server_error
from devsched.agent.runner import RunResult
from devsched.agent.spool import Spool
from devsched.core.errors import Internal, InvalidRequest, NotFound, Unavailable
from devsched.core.status import Outcome, TaskStatus
from devsched.protocol import messages as m
from devsched.protocol.base import MAX_REASON_CHARS
from devsched.protocol.codec import decode
from devsched.protocol.transport import NoReply

pytestmark = pytest.mark.unit

TASK, LEASE = uuid.UUID(int=1), uuid.UUID(int=2)


def report() -> m.ReportRequest:
    return m.ReportRequest(task_id=TASK, attempt=1, lease_id=LEASE, outcome=Outcome.DONE)


class FakeClient:
    """Answers reports from a script: an exception to raise, or None for a recorded reply."""

    def __init__(self, *answers: Exception | None) -> None:
        self.answers = list(answers)
        self.bodies: list[bytes] = []

    async def report(self, body: bytes) -> m.ReportReply:
        self.bodies.append(body)
        answer = self.answers.pop(0) if self.answers else None
        if answer is not None:
            raise answer
        return m.ReportReply(task_id=TASK, attempt=1, status=TaskStatus.DONE, recorded_at=datetime.now(UTC))


def reporter(client: FakeClient, spool: Spool, **options: object) -> Reporter:
    return Reporter(cast(HostClient, client), spool, base_backoff_s=0.001, max_backoff_s=0.005, **options)  # type: ignore[arg-type]


def parked_total() -> float:
    return REGISTRY.get_sample_value("devsched_agent_reports_parked_total") or 0.0


async def test_a_report_failing_with_server_errors_is_parked_and_stays_spooled(tmp_path: Path) -> None:
    spool, client = Spool(tmp_path), FakeClient(*[Internal()] * 10_000)
    sender = reporter(client, spool, park_after_s=0.05)
    before = parked_total()
    spooled = await sender.store(report())
    assert await sender.deliver(spooled) is None
    assert 2 <= len(client.bodies) < 10_000  # retried, then stopped
    assert sender.parked == {spooled.key}
    assert [r.key for r in spool.pending()] == [spooled.key]  # never lost
    assert not (tmp_path / "rejected").exists()
    assert parked_total() == before + 1
    assert await sender.pending() == []  # not sent again in this run


async def test_a_parked_report_is_sent_again_at_the_next_start(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    first = reporter(FakeClient(*[Internal()] * 10_000), spool, park_after_s=0.02)
    await first.deliver(await first.store(report()))
    # The next start: a new reporter with an empty parked set, and a scheduler that works again.
    again = reporter(FakeClient(None), spool)
    pending = await again.pending()
    assert len(pending) == 1
    assert await again.deliver(pending[0]) is not None
    assert spool.pending() == []


async def test_an_outage_is_waited_out_and_resets_the_server_error_clock(tmp_path: Path) -> None:
    # Server errors and outage in turn, longer in all than park_after_s: the 500s never run long enough in a row.
    answers: list[Exception | None] = []
    for _ in range(40):
        answers += [Internal(), NoReply(), Unavailable()]
    client = FakeClient(*answers, None)
    sender = reporter(client, Spool(tmp_path), park_after_s=0.004)
    assert await sender.deliver(await sender.store(report())) is not None
    assert sender.parked == set()


@pytest.mark.parametrize(
    ("exc", "server"),
    [(Internal(), True), (Unavailable(), False), (NoReply(), False), (NotFound(), False), (InvalidRequest("x"), False)],
)
def test_which_answers_are_server_errors(exc: Exception, server: bool) -> None:
    assert is_server_error(exc) is server


# -- what the agent sends is storable ---------------------------------------------------------------------

ASSIGNMENT = m.Assignment(
    task_id=TASK,
    attempt=1,
    lease_id=LEASE,
    device_id="d1",
    plan=m.Plan(steps=[m.Step(name="a", action="noop")]),
    ttl_s=30,
    expires_at=datetime.now(UTC),
)


def test_a_reason_with_nul_lone_surrogates_or_too_long_is_made_storable() -> None:
    reason = "step 'a' failed: \x00bad\udcff" + "x" * 5000
    result = RunResult(Outcome.FAILED, reason, ())
    for wire in (to_wire(result, ASSIGNMENT), release_of(ASSIGNMENT, reason)):
        assert wire.reason is not None
        assert "\x00" not in wire.reason
        assert "\udcff" not in wire.reason
        assert len(wire.reason) == MAX_REASON_CHARS
        decode(type(wire), wire.model_dump_json().encode())  # the scheduler's edge takes it


@pytest.mark.parametrize(
    "labels", [{"os": "a\x00"}, {"os\ud800": "a"}, {"k" * 257: "v"}, {f"k{i}": "v" for i in range(101)}]
)
def test_device_labels_the_scheduler_would_refuse_are_a_config_error(labels: dict[str, str], tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"devices\.0\.labels"):
        parse_config({"host_id": "h", "spool_dir": str(tmp_path), "devices": [{"device_id": "d", "labels": labels}]})
