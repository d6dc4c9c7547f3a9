"""Replies built from the values the services compute (`WireModel.from_value`): same fields, same wire."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from pydantic import ValidationError

from devsched.core import views
from devsched.core.leases import Extension
from devsched.core.records import Selector
from devsched.core.status import AttemptStatus, DeviceState, EndReason, TaskStatus
from devsched.protocol import messages as m
from devsched.protocol.codec import encode
from devsched.store import CancelReceipt, ReportReceipt, Submitted

from .samples import LEASE_ID, PLAN, PROGRESS, RESULT, SAMPLES, SUMMARY_FIELDS, T0, T1, TASK_ID

pytestmark = pytest.mark.unit

#: Each reply model built with `from_value`, the value it is built from, and the value's fields it leaves out.
PAIRS: list[tuple[type[m.WireModel], type[Any], set[str]]] = [
    (m.AttemptView, views.AttemptView, set()),
    (m.TaskView, views.TaskView, set()),
    (m.TaskSummary, views.TaskView, {"attempts"}),
    (m.ListTasksReply, views.TaskPage, set()),
    (m.HostView, views.HostView, set()),
    (m.DeviceView, views.DeviceView, {"host_id"}),
    (m.DeviceDrainView, views.DeviceView, set()),
    (m.SubmitReply, Submitted, set()),
    (m.CancelReply, CancelReceipt, {"nudge"}),
    (m.ReportReply, ReportReceipt, set()),
    (m.LeaseReply, Extension, {"dispatch"}),
]


@pytest.mark.parametrize(("model", "value", "left_out"), PAIRS, ids=lambda p: getattr(p, "__name__", ""))
def test_a_reply_names_exactly_the_fields_of_its_value(
    model: type[m.WireModel], value: type[Any], left_out: set[str]
) -> None:
    # A field added to one side only would be dropped, or defaulted, without a sound: fail here instead.
    assert set(model.model_fields) == {f.name for f in dataclasses.fields(value)} - left_out


def _attempt(**changes: Any) -> views.AttemptView:
    base = views.AttemptView(
        attempt=1,
        lease_id=LEASE_ID,
        host_id="h1",
        device_id="pixel-7-a",
        status=AttemptStatus.ACTIVE,
        assigned_at=T0,
        dispatched_at=T0,
        expires_at=T1,
        ended_at=None,
        end_reason=None,
        progress=PROGRESS.model_dump(mode="json"),
        cancel_requested=False,
        report_reason=None,
        result=None,
    )
    return dataclasses.replace(base, **changes)


def _task(**changes: Any) -> views.TaskView:
    """The core value of the `TaskView` sample, with JSON columns as the store reads them."""
    fields = {k: v for k, v in SUMMARY_FIELDS.items() if k not in ("selector", "plan")}
    base = views.TaskView(
        **fields,
        selector=Selector(labels={"platform": "android"}, device_id="pixel-7-a"),
        plan=PLAN.model_dump(mode="json"),
        idempotency_key=None,
        reason=None,
        result=None,
        attempts=(
            _attempt(status=AttemptStatus.EXPIRED, ended_at=T1, end_reason=EndReason.LEASE_EXPIRED),
            _attempt(attempt=2),
        ),
    )
    return dataclasses.replace(base, **changes)


def test_a_task_view_is_the_sample_byte_for_byte() -> None:
    reply = m.TaskView.from_value(_task())
    assert reply == SAMPLES["TaskView"]
    assert encode(reply) == encode(SAMPLES["TaskView"])


def test_an_ended_task_carries_its_result() -> None:
    ended = _task(status=TaskStatus.FAILED, reason="step flash failed", result=RESULT.model_dump(mode="json"))
    assert m.TaskView.from_value(dataclasses.replace(ended, attempts=())) == SAMPLES["TaskView(ended)"]


def test_a_listing_leaves_out_the_attempts() -> None:
    reply = m.ListTasksReply.from_value(views.TaskPage(tasks=(_task(),), next="opaque"))
    assert encode(reply) == encode(SAMPLES["ListTasksReply"])
    assert '"attempts"' not in encode(reply).decode()


def test_hosts_and_a_drained_device() -> None:
    device = views.DeviceView("d1", "h1", {"platform": "android"}, DeviceState.RESERVED, False, None)
    host = views.HostView("h1", True, T0, None, (device,))
    assert m.HostsListReply(hosts=[m.HostView.from_value(host)]) == SAMPLES["HostsListReply"]
    drained = views.DeviceView("d1", "h1", {}, DeviceState.DRAINED, True, "flaky USB hub")
    assert m.DeviceDrainView.from_value(drained) == SAMPLES["DeviceDrainView"]


def test_receipts_and_grants() -> None:
    assert m.SubmitReply.from_value(Submitted(TASK_ID, TaskStatus.QUEUED, created=True)) == SAMPLES["SubmitReply"]
    receipt = CancelReceipt(TASK_ID, TaskStatus.DISPATCHED, cancel_requested=True, nudge=("h1", 1))
    assert m.CancelReply.from_value(receipt) == SAMPLES["CancelReply"]
    report = ReportReceipt(TASK_ID, 1, TaskStatus.CANCELLED, T1, duplicate=True)
    assert m.ReportReply.from_value(report) == SAMPLES["ReportReply"]
    assert m.LeaseReply.from_value(Extension(T1, 30, cancel_requested=False, dispatch=True)) == SAMPLES["LeaseReply"]


def test_a_value_the_wire_refuses_is_still_refused() -> None:
    with pytest.raises(ValidationError):
        m.LeaseReply.from_value(Extension(T1, 0, cancel_requested=False))
    with pytest.raises(ValidationError):
        m.TaskView.from_value(_task(plan={"steps": []}))
