"""Replies that fit (`devsched.scheduler.replies`): pages cut by bytes, large fields cut and flagged."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest

from devsched.core.errors import InvalidRequest
from devsched.core.status import TaskStatus
from devsched.protocol import messages as m
from devsched.protocol.base import STORED
from devsched.protocol.codec import decode, encode
from devsched.scheduler.replies import (
    LIST_FIELD_BYTES,
    LIST_TAIL_CHARS,
    decode_key,
    encode_key,
    fit,
    fit_reports,
    list_item,
    size,
    trim_view,
)

pytestmark = pytest.mark.unit

KiB = 1024
T0 = datetime(2025, 3, 4, 5, 6, 7, 890123, tzinfo=UTC)
VIEW = m.TaskView(
    task_id=uuid.UUID("0b6f8d7e-2c1a-4e59-9a7f-3d2b1c0e9f11"),
    name="flash-and-test",
    status=TaskStatus.FAILED,
    priority=0,
    max_attempts=3,
    attempt_count=1,
    cancel_requested=False,
    selector=m.Selector(labels={"platform": "android"}),
    plan=m.Plan(steps=[m.Step(name=f"s{i}", action="shell", args={"command": "echo hi"}) for i in range(4)]),
    created_at=T0,
    updated_at=T0,
    reason="step s0 failed",
    result=m.RunResult(
        steps=[m.StepResult(name=f"s{i}", status=m.StepStatus.DONE, exit_code=0, output_tail="ok\n") for i in range(4)]
    ),
    metadata={"ci": "run-1"},
)


def summary(view: m.TaskView) -> m.TaskSummary:
    return m.TaskSummary.model_validate(view.model_dump(exclude={"attempts", "artifacts"}), context=STORED)


def big_view(metadata_kib: int, tail_kib: int) -> m.TaskView:
    assert VIEW.result is not None
    steps = [s.model_copy(update={"output_tail": "o" * tail_kib * KiB}) for s in VIEW.result.steps]
    return VIEW.model_copy(
        update={
            "metadata": {"blob": "m" * metadata_kib * KiB},
            "result": VIEW.result.model_copy(update={"steps": steps}),
        }
    )


def test_fit_cuts_a_page_before_the_budget_and_keeps_at_least_one() -> None:
    items = [summary(big_view(100, 0)) for _ in range(10)]
    n = fit(items, 450 * KiB)
    assert n == 4
    assert sum(size(i) for i in items[:n]) < 450 * KiB
    assert fit(items[:1], 10 * KiB) == 1, "an item alone over the budget is still listed"
    assert fit([], 10) == 0


def test_a_list_item_cuts_large_metadata_and_tails_and_names_them() -> None:
    item = list_item(summary(big_view(300, 400)))
    assert item.metadata == {}
    assert item.result is not None
    assert all(len(s.output_tail or "") <= LIST_TAIL_CHARS for s in item.result.steps)
    assert item.truncated == ["metadata", "result"]
    assert size(item) < 8 * KiB
    wire = decode(m.TaskSummary, encode(item))
    assert wire.truncated == ["metadata", "result"], "the flag travels and decodes"


def test_a_small_list_item_is_unchanged_and_shows_no_flag() -> None:
    small = summary(VIEW)
    assert list_item(small) == small
    assert b"truncated" not in encode(small)
    assert size(small) < LIST_FIELD_BYTES


def test_a_view_is_cut_mildest_first_until_it_fits() -> None:
    view = big_view(300, 200)  # 4 steps x 200 KiB of tail + 300 KiB of metadata
    assert size(view) > 1000 * KiB
    trimmed = trim_view(view, 1000 * KiB)
    assert size(trimmed) <= 1000 * KiB
    assert trimmed.metadata == view.metadata, "the metadata fits once the tails are cut"
    assert trimmed.truncated == ["result"], "the attempts and artifacts had nothing to cut"


def test_a_field_asked_in_full_is_kept_and_others_cut() -> None:
    view = big_view(300, 200)
    trimmed = trim_view(view, 400 * KiB, full=["result"])
    assert trimmed.result == view.result
    assert trimmed.metadata == {}
    assert "metadata" in trimmed.truncated
    assert "result" not in trimmed.truncated


def test_a_view_that_fits_is_untouched() -> None:
    assert trim_view(VIEW, 1000 * KiB) == VIEW


def test_cursors_round_trip_and_a_forged_one_is_a_400() -> None:
    assert decode_key(encode_key([3, "out/a.bin"]), (int, str)) == (3, "out/a.bin")
    for forged in ("not base64!", encode_key(["x", "y"]), encode_key([1]), encode_key({"a": 1})):  # type: ignore[list-item]
        with pytest.raises(InvalidRequest) as caught:
            decode_key(forged, (int, str))
        assert caught.value.details["errors"][0]["path"] == "after"


def _outcome(n: int, plan_bytes: int = 0) -> m.ReportOutcome:
    task_id = uuid.UUID(int=n)
    handed = m.HandedAttempt(
        task_id=uuid.UUID(int=1000 + n), attempt=1, lease_id=uuid.UUID(int=2000 + n), device_id=f"d{n}",
        plan=m.Plan(steps=[m.Step(name="s", action="shell", args={"command": "x" * max(1, plan_bytes)})]),
        ttl_s=30, expires_at=T0,
    )  # fmt: skip
    return m.ReportOutcome(
        task_id=task_id, attempt=1, lease_id=uuid.UUID(int=3000 + n), status=TaskStatus.DONE, recorded_at=T0,
        next=handed,
    )  # fmt: skip


def test_a_reports_reply_that_fits_is_left_whole() -> None:
    outcomes = [_outcome(n) for n in range(5)]
    assert fit_reports(outcomes, 64 * KiB) == outcomes


def test_reports_past_a_replys_budget_are_answered_unavailable_in_their_place() -> None:
    outcomes = [_outcome(n, plan_bytes=10 * KiB) for n in range(5)]
    fitted = fit_reports(outcomes, 25 * KiB)
    assert size(m.ReportsReply(reports=fitted)) <= 25 * KiB
    assert fitted[:2] == outcomes[:2]
    assert [(o.task_id, o.attempt, o.lease_id) for o in fitted] == [
        (o.task_id, o.attempt, o.lease_id) for o in outcomes
    ]
    for later in fitted[2:]:
        assert later.error is not None
        assert later.error.code == "unavailable"
        assert (later.status, later.next) == (None, None)
    first_alone = fit_reports(outcomes[:2], 1 * KiB)
    assert first_alone[0] == outcomes[0], "the first is always answered"
    assert first_alone[1].error is not None
