"""Replies built from the values the services compute (`WireModel.from_value`): same fields, same wire."""

from __future__ import annotations

import dataclasses
from typing import Any, cast

import pytest
from pydantic import ValidationError

from devsched.core import events, views
from devsched.core.leases import Extension
from devsched.core.records import Selector
from devsched.core.status import DeviceState, TaskStatus
from devsched.protocol import messages as m
from devsched.protocol.codec import encode
from devsched.store import CancelReceipt, ReportReceipt, Submitted
from devsched.store.views import Handed

from .samples import SAMPLES, T0, T1, TASK_ID

pytestmark = pytest.mark.unit

#: Each reply model built with `from_value`, the value it is built from, and the value's fields it leaves out.
PAIRS: list[tuple[type[m.WireModel], type[Any], set[str]]] = [
    (m.AttemptView, views.AttemptView, set()),
    (m.TaskView, views.TaskView, set()),
    (m.TaskSummary, views.TaskView, {"attempts", "artifacts"}),
    (m.ArtifactView, views.ArtifactView, set()),
    (m.ListTasksReply, views.TaskPage, set()),
    (m.HostView, views.HostView, set()),
    (m.DeviceView, views.DeviceView, {"host_id"}),
    (m.DeviceDrainView, views.DeviceView, set()),
    (m.SubmitReply, Submitted, set()),
    (m.CancelReply, CancelReceipt, {"nudge"}),
    (m.ReportReply, ReportReceipt, set()),
    (m.ReleaseReply, ReportReceipt, {"next"}),
    (m.HandedAttempt, Handed, set()),
    (m.LeaseReply, Extension, {"dispatch"}),
    (m.TaskEvent, events.TaskEvent, set()),
    (m.DeviceEventMessage, events.DeviceEvent, set()),
    (m.Assignment, events.AttemptAssigned, {"host_id"}),
    (m.Progress, events.StepProgress, set()),
]


#: Fields the scheduler sets on a reply and no value carries: the fields cut to fit (`scheduler.replies`), and a
#: host's logs closed for its output rate (from JetStream, `scheduler.warden`).
REPLY_ONLY = {"truncated", "logs_closed_until"}


@pytest.mark.parametrize(("model", "value", "left_out"), PAIRS, ids=lambda p: getattr(p, "__name__", ""))
def test_a_reply_names_exactly_the_fields_of_its_value(
    model: type[m.WireModel], value: type[Any], left_out: set[str]
) -> None:
    # A field added to one side only would be dropped, or defaulted, without a sound: fail here instead.
    assert set(model.model_fields) - REPLY_ONLY == {f.name for f in dataclasses.fields(value)} - left_out


def _core_task(reply: m.TaskView) -> views.TaskView:
    """The core value a reply sample stands for, with nested values as the store has them (plain dicts
    for the JSON columns, core's Selector, a tuple of attempts)."""
    fields = reply.model_dump()
    return views.TaskView(
        **{
            **fields,
            "selector": Selector(**fields["selector"]),
            "attempts": tuple(views.AttemptView(**a) for a in fields["attempts"]),
        }
    )


@pytest.mark.parametrize("name", ["TaskView", "TaskView(ended)"])
def test_a_task_view_is_the_sample_byte_for_byte(name: str) -> None:
    value = _core_task(cast(m.TaskView, SAMPLES[name]))
    assert isinstance(value.plan, dict)
    reply = m.TaskView.from_value(value)
    assert reply == SAMPLES[name]
    assert encode(reply) == encode(SAMPLES[name])


def test_a_listing_leaves_out_the_attempts() -> None:
    page = views.TaskPage(tasks=(_core_task(cast(m.TaskView, SAMPLES["TaskView"])),), next="opaque")
    reply = m.ListTasksReply.from_value(page)
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
    empty_plan = dataclasses.replace(_core_task(cast(m.TaskView, SAMPLES["TaskView"])), plan={"steps": []})
    with pytest.raises(ValidationError):
        m.TaskView.from_value(empty_plan)
