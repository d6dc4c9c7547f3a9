"""The Queue's filters from the query string, the steps' durations from their events, the lease-id mask
over a byte stream, the charts' axis marks, and the resubmit request built from a task."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from devsched.client import InvalidRequest
from devsched.client.resubmit import RESUBMIT_OF, resubmit_of, resubmit_request
from devsched.protocol.base import MAX_METADATA_BYTES
from devsched.protocol.messages import AttemptView, TaskEvent, TaskView
from devsched.web import charts, views

pytestmark = pytest.mark.unit

NOW = datetime(2026, 1, 2, 12, 0, tzinfo=UTC)


def test_queue_filters_are_read_from_the_query_string_and_kept_in_links() -> None:
    filters, problems = views.queue_filters(
        {"status": "queued", "kind": "user", "device": "pixel-1", "id": "3AF5939C", "after": "c1", "page": "2"}
    )
    assert problems == []
    assert filters == views.QueueFilters("queued", "user", "pixel-1", "3af5939c", "c1")
    assert filters.active
    assert filters.query() == "?status=queued&kind=user&device=pixel-1&id=3af5939c"
    assert filters.query(after="n/2+") == "?status=queued&kind=user&device=pixel-1&id=3af5939c&after=n%2F2%2B"
    empty, problems = views.queue_filters({"status": "", "kind": " ", "device": "", "id": ""})
    assert (empty, problems) == (views.QueueFilters(), [])
    assert not empty.active
    assert empty.query() == ""
    assert not views.QueueFilters(after="c1").active  # a cursor alone filters nothing


@pytest.mark.parametrize(
    ("params", "named"),
    [
        ({"status": "sleeping"}, "status: 'sleeping' is not a task status"),
        ({"kind": "robot"}, "kind: 'robot' is not a task kind"),
        ({"device": "a b/c"}, "device: 'a b/c' is not a device id"),
        ({"id": "3af5"}, "id: '3af5' is not a task id"),
        ({"id": "<script>"}, "id: '<script>' is not a task id"),
        ({"status": "done", "after": "x" * 5000}, "after: not a cursor"),
    ],
)
def test_a_bad_filter_is_named_and_left_out(params: dict[str, str], named: str) -> None:
    filters, problems = views.queue_filters(params)
    assert len(problems) == 1
    assert problems[0].startswith(named), problems
    assert filters.after is None or len(filters.after) <= 4096


def attempt(number: int = 1, *, ended: datetime | None = None) -> AttemptView:
    return AttemptView(
        attempt=number, lease_id=uuid.uuid4(), host_id="h", device_id="d",
        status="done" if ended else "active", assigned_at=NOW, dispatched_at=NOW,
        expires_at=NOW + timedelta(minutes=1), ended_at=ended, end_reason="done" if ended else None,
    )  # fmt: skip


def progress(task_id: uuid.UUID, seq: int, seconds: float, index: int, step: str, number: int = 1) -> TaskEvent:
    return TaskEvent(
        event="progress", task_id=task_id, seq=seq, attempt=number, status="dispatched",
        at=NOW + timedelta(seconds=seconds), progress={"step": step, "index": index, "of": 3},
    )  # fmt: skip


def test_step_durations_come_from_the_progress_events_and_the_attempts_end() -> None:
    task_id = uuid.uuid4()
    events = [
        progress(task_id, 3, 1.0, 0, "flash"),
        progress(task_id, 4, 1.5, 0, "flash"),  # a repeated report of the same step: its first time counts
        progress(task_id, 5, 75.0, 1, "test"),
        progress(task_id, 6, 4.0, 0, "other", number=2),  # another attempt's
        progress(task_id, 7, 80.0, 2, "collect"),
    ]
    ended = views.attempt_row(attempt(ended=NOW + timedelta(seconds=90.25)), events, NOW + timedelta(hours=1))
    assert [(s.index, s.name, s.seconds, s.running) for s in ended.steps] == [
        (1, "flash", 74.0, False), (2, "test", 5.0, False), (3, "collect", 10.25, False),
    ]  # fmt: skip
    assert [s.text for s in ended.steps] == ["1m14s", "5.0 s", "10 s"]
    running = views.attempt_row(attempt(), events[:3], NOW + timedelta(seconds=100))
    assert [(s.name, s.text) for s in running.steps] == [("flash", "1m14s"), ("test", "running 25 s")]
    assert running.steps[-1].running
    assert views.attempt_row(attempt(), events[:3]).steps[-1].text == ""  # no clock: the elapsed time is unknown
    assert views.attempt_row(attempt(), []).steps == []


@pytest.mark.parametrize(
    ("seconds", "text"), [(-1, "0.0 s"), (0.44, "0.4 s"), (12.7, "12 s"), (185, "3m05s"), (3725, "1h02m")]
)
def test_duration_text(seconds: float, text: str) -> None:
    assert views.duration_text(seconds) == text


def test_the_lease_mask_hides_an_id_cut_between_chunks_and_keeps_every_other_byte() -> None:
    lease = str(uuid.uuid4())
    data = b"\x00\x1b[2Jstart " + lease.encode() + b" end\xff\n" + lease.encode()
    for size in (1, 3, 7, 36, 1000):
        mask = views.LeaseMask([lease])
        out = b"".join(mask.feed(data[i : i + size]) for i in range(0, len(data), size)) + mask.flush()
        assert out == data.replace(lease.encode(), views.HIDDEN.encode()), size
    untouched = views.LeaseMask([])
    assert untouched.feed(data) == data  # nothing to mask: nothing held back
    assert untouched.flush() == b""


def test_axis_marks_label_counts_and_quarter_hours() -> None:
    ticks = charts.y_ticks(8, 160)
    assert [(t.at, t.label) for t in ticks] == [(160, "0"), (120, "2"), (80, "4"), (40, "6"), (0, "8")]
    assert [t.label for t in charts.y_ticks(1, 160)] == ["0", "1"]
    minute = charts.minute_of(datetime(2026, 1, 2, 11, 0, tzinfo=UTC))
    marks = charts.x_ticks(list(range(minute + 1, minute + 61)), 600)
    assert [t.label for t in marks] == ["11:15", "11:30", "11:45", "12:00"]
    assert marks[0].at == pytest.approx(14 * 10 + 5)


def view(**fields: Any) -> TaskView:
    base: dict[str, Any] = {
        "task_id": uuid.uuid4(), "name": "nightly", "status": "failed", "priority": 7, "max_attempts": 2,
        "attempt_count": 2, "cancel_requested": False, "selector": {"labels": {"board": "rpi4"}},
        "plan": {"steps": [{"name": "s", "action": "shell", "args": {"command": "make test"}}]},
        "created_at": NOW - timedelta(hours=1), "updated_at": NOW, "lease_ttl_s": 45,
        "idempotency_key": "nightly-2026-01-01", "metadata": {"team": "qa"},
        "retry": {"on": ["infra"], "backoff": {"initial_s": 2, "max_s": 10}}, "queue_timeout_s": 600.0,
        "attempt_timeout_s": 120.0,
    }  # fmt: skip
    base.update(fields)
    return TaskView.model_validate(base)


def test_a_resubmit_repeats_the_plan_selector_and_options_but_not_the_key() -> None:
    old = view(deadline=NOW + timedelta(hours=2))
    request = resubmit_request(old, NOW)
    assert request.plan == old.plan
    assert request.selector == old.selector
    assert (request.name, request.priority, request.max_attempts, request.lease_ttl_s) == ("nightly", 7, 2, 45)
    assert request.metadata == {"team": "qa", RESUBMIT_OF: str(old.task_id)}  # the link to the old task
    assert resubmit_of(request.metadata) == old.task_id
    assert request.retry == old.retry
    assert (request.queue_timeout_s, request.attempt_timeout_s) == (600.0, 120.0)
    assert request.deadline == old.deadline
    assert request.idempotency_key is None  # the client makes a new one: the old key would return the old task
    assert resubmit_request(view(deadline=NOW - timedelta(seconds=1)), NOW).deadline is None  # passed: dropped
    with pytest.raises(InvalidRequest, match="health check"):
        resubmit_request(view(kind="health", health_device_id="d1"), NOW)
    with pytest.raises(InvalidRequest, match="metadata"):
        resubmit_request(view(metadata={}, truncated=["metadata"]), NOW)


def test_a_resubmit_of_a_resubmit_names_its_own_original_and_a_full_metadata_goes_without_the_link() -> None:
    first = view()
    second = view(metadata=resubmit_request(first, NOW).metadata)
    third = resubmit_request(second, NOW)
    assert resubmit_of(third.metadata) == second.task_id
    assert third.metadata["team"] == "qa"
    filler = "x" * (MAX_METADATA_BYTES - len('{"pad":""}'))  # exactly the limit: no room for the link
    full = view(metadata={"pad": filler})
    assert resubmit_request(full, NOW).metadata == {"pad": filler}  # repeated all the same
    assert resubmit_of({}) is None
    assert resubmit_of({RESUBMIT_OF: "not-an-id"}) is None
    assert resubmit_of({RESUBMIT_OF: 7}) is None


def test_a_resubmit_that_breaks_a_limit_of_today_is_refused_naming_the_field() -> None:
    stored = view().model_copy(update={"priority": 10**6})  # a task stored under looser limits
    with pytest.raises(InvalidRequest, match="priority"):
        resubmit_request(stored, NOW)
