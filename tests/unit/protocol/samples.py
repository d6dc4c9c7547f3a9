"""One filled-in instance of every message, for round-trip tests."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

from pydantic import BaseModel

from devsched.core.status import AttemptStatus, DeviceState, EndReason, EventKind, Outcome, TaskStatus
from devsched.protocol import messages as m

TASK_ID = uuid.UUID("0b6f8d7e-2c1a-4e59-9a7f-3d2b1c0e9f11")
LEASE_ID = uuid.UUID("5e1d2c3b-4a59-4687-9a1b-2c3d4e5f6a7b")
T0 = datetime(2025, 3, 4, 5, 6, 7, 890123, tzinfo=UTC)
T1 = T0 + timedelta(seconds=30)

PLAN = m.Plan(
    steps=[
        m.Step(name="flash", action="shell", args={"command": "echo flashing"}, timeout_s=600),
        m.Step(name="wait", action="sleep", args={"seconds": 0.5}, interruptible=True),
        m.Step(name="collect-logs", action="noop", always=True),
        m.Step(name="custom", action="lab.power_cycle", args={"outlet": 3, "nested": {"a": [1, 2.5, None, True]}}),
    ]
)
SELECTOR = m.Selector(labels={"platform": "android"}, device_id="pixel-7-a")
PROGRESS = m.Progress(step="wait", index=1, of=4)
RESULT = m.RunResult(
    steps=[
        m.StepResult(
            name="flash", status=m.StepStatus.DONE, exit_code=0, started_at=T0, finished_at=T1, output_tail="ok\n"
        ),
        m.StepResult(name="wait", status=m.StepStatus.INTERRUPTED, started_at=T1, finished_at=T1),
        m.StepResult(name="collect-logs", status=m.StepStatus.DONE, started_at=T1, finished_at=T1),
        m.StepResult(name="custom", status=m.StepStatus.SKIPPED),
    ]
)
ATTEMPT = m.AttemptView(
    attempt=1,
    lease_id=LEASE_ID,
    host_id="h1",
    device_id="pixel-7-a",
    status=AttemptStatus.ACTIVE,
    assigned_at=T0,
    dispatched_at=T0,
    expires_at=T1,
    progress=PROGRESS,
)
SUMMARY_FIELDS: dict[str, Any] = {
    "task_id": TASK_ID,
    "name": "flash-and-test",
    "status": TaskStatus.DISPATCHED,
    "priority": 5,
    "max_attempts": 3,
    "attempt_count": 1,
    "cancel_requested": False,
    "selector": SELECTOR,
    "plan": PLAN,
    "created_at": T0,
    "updated_at": T1,
    "lease_ttl_s": 30,
    "metadata": {"ci": {"run": 1234}},
}

#: One instance of every message type (and of the nested values worth checking on their own).
SAMPLES: dict[str, BaseModel] = {
    "Step": PLAN.steps[0],
    "Plan": PLAN,
    "Selector": SELECTOR,
    "Progress": PROGRESS,
    "ShellArgs": m.ShellArgs(command="ls", env={"A": "1"}, cwd="/tmp"),
    "SleepArgs": m.SleepArgs(seconds=2),
    "StepResult": RESULT.steps[0],
    "RunResult": RESULT,
    "SubmitRequest": m.SubmitRequest(
        name="flash-and-test",
        selector=SELECTOR,
        plan=PLAN,
        priority=-1000,
        max_attempts=100,
        lease_ttl_s=3600,
        idempotency_key="ci-run-1234",
        metadata={"x": [1, "two", {"three": 3.0}]},
    ),
    "SubmitRequest(minimal)": m.SubmitRequest(plan=PLAN),
    "SubmitReply": m.SubmitReply(task_id=TASK_ID, status=TaskStatus.QUEUED, created=True),
    "GetTaskRequest": m.GetTaskRequest(task_id=TASK_ID),
    "AttemptView": ATTEMPT,
    "TaskSummary": m.TaskSummary(**SUMMARY_FIELDS),
    "TaskView": m.TaskView(
        **SUMMARY_FIELDS,
        attempts=[
            ATTEMPT.model_copy(
                update={
                    "attempt": 1,
                    "status": AttemptStatus.EXPIRED,
                    "ended_at": T1,
                    "end_reason": EndReason.LEASE_EXPIRED,
                }
            ),
            ATTEMPT.model_copy(update={"attempt": 2}),
        ],
    ),
    "TaskView(ended)": m.TaskView(
        **{**SUMMARY_FIELDS, "status": TaskStatus.FAILED},
        reason="step flash failed",
        result=RESULT,
        pending_reason=None,
    ),
    "ListTasksRequest": m.ListTasksRequest(status=TaskStatus.QUEUED, limit=1000, after="cursor-1"),
    "ListTasksReply": m.ListTasksReply(tasks=[m.TaskSummary(**SUMMARY_FIELDS)], next="opaque"),
    "CancelRequest": m.CancelRequest(task_id=TASK_ID, reason="no longer needed"),
    "CancelReply": m.CancelReply(task_id=TASK_ID, status=TaskStatus.DISPATCHED, cancel_requested=True),
    "HostsListRequest": m.HostsListRequest(),
    "HostsListReply": m.HostsListReply(
        hosts=[
            m.HostView(
                host_id="h1",
                online=True,
                last_seen_at=T0,
                devices=[m.DeviceView(device_id="d1", labels={"platform": "android"}, state=DeviceState.RESERVED)],
            )
        ]
    ),
    "DrainRequest": m.DrainRequest(device_id="d1", drained=False, reason="fixed"),
    "DeviceDrainView": m.DeviceDrainView(
        device_id="d1", host_id="h1", labels={}, state=DeviceState.DRAINED, drained=True, drain_reason="flaky USB hub"
    ),
    "RegisterRequest": m.RegisterRequest(
        devices=[
            m.DeviceRegistration(device_id="d1", labels={"platform": "android"}),
            m.DeviceRegistration(device_id="d2"),
        ],
        agent_version="0.1.0",
    ),
    "RegisterReply": m.RegisterReply(heartbeat_interval_s=5, claim_progress=True),
    "HeartbeatRequest": m.HeartbeatRequest(),
    "HeartbeatReply": m.HeartbeatReply(heartbeat_interval_s=0.25),
    "ClaimRequest": m.ClaimRequest(task_id=TASK_ID, attempt=1, lease_id=LEASE_ID),
    "ClaimRequest(progress)": m.ClaimRequest(task_id=TASK_ID, attempt=1, lease_id=LEASE_ID, progress=PROGRESS),
    "RenewRequest": m.RenewRequest(task_id=TASK_ID, attempt=2, lease_id=LEASE_ID, progress=PROGRESS),
    "RenewRequest(no progress)": m.RenewRequest(task_id=TASK_ID, attempt=2, lease_id=LEASE_ID),
    "LeaseReply": m.LeaseReply(expires_at=T1, ttl_s=30, cancel_requested=False),
    "ReportRequest": m.ReportRequest(
        task_id=TASK_ID, attempt=1, lease_id=LEASE_ID, outcome=Outcome.CANCELLED, reason="cancelled", result=RESULT
    ),
    "ReportReply": m.ReportReply(
        task_id=TASK_ID, attempt=1, status=TaskStatus.CANCELLED, recorded_at=T1, duplicate=True
    ),
    "ReportRequest(take_next)": m.ReportRequest(
        task_id=TASK_ID, attempt=1, lease_id=LEASE_ID, outcome=Outcome.DONE, result=RESULT, take_next=True
    ),
    "ReportReply(next)": m.ReportReply(
        task_id=TASK_ID,
        attempt=1,
        status=TaskStatus.DONE,
        recorded_at=T1,
        next=m.HandedAttempt(
            task_id=TASK_ID, attempt=2, lease_id=LEASE_ID, device_id="d1", plan=PLAN, ttl_s=30, expires_at=T1
        ),
    ),
    "RegisterReply(take_next)": m.RegisterReply(heartbeat_interval_s=5, claim_progress=True, take_next=True),
    "Assignment": m.Assignment(
        task_id=TASK_ID, attempt=1, lease_id=LEASE_ID, device_id="d1", plan=PLAN, ttl_s=30, expires_at=T1
    ),
    "TaskEvent": m.TaskEvent(
        event=EventKind.PROGRESS,
        task_id=TASK_ID,
        seq=7,
        attempt=1,
        status=TaskStatus.DISPATCHED,
        at=datetime(2025, 3, 4, 7, 6, 7, tzinfo=timezone(timedelta(hours=2))),
        host_id="h1",
        device_id="d1",
        progress=PROGRESS,
    ),
    "TaskEvent(submitted)": m.TaskEvent(
        event=EventKind.SUBMITTED, task_id=TASK_ID, seq=1, status=TaskStatus.QUEUED, at=T0
    ),
    "ReleaseRequest": m.ReleaseRequest(
        task_id=TASK_ID, attempt=2, lease_id=LEASE_ID, reason="shutdown: agent shutting down", result=RESULT
    ),
    "ReleaseRequest(bare)": m.ReleaseRequest(task_id=TASK_ID, attempt=1, lease_id=LEASE_ID),
    "ReleaseReply": m.ReleaseReply(task_id=TASK_ID, attempt=2, status=TaskStatus.QUEUED, recorded_at=T1),
    "HostDrainRequest": m.HostDrainRequest(host_id="bench-07", reason="kernel update"),
    "ForgetDeviceRequest": m.ForgetDeviceRequest(device_id="d1", reason="moved to bench-08"),
    "DeviceForgottenView": m.DeviceForgottenView(
        device_id="d1", host_id="bench-07", freed_at=T1, reason="moved to bench-08", actor="operator-api", audit_id=7
    ),
    "LabelDeviceRequest": m.LabelDeviceRequest(device_id="d1", labels={"pool": "release"}, unset=["rack"]),
    "DeviceDrainView(labelled)": m.DeviceDrainView(
        device_id="d1",
        host_id="h1",
        labels={"pool": "release", "os": "14"},
        state=DeviceState.AVAILABLE,
        drained=False,
        operator_labels={"pool": "release"},
    ),
    "Nudge": m.Nudge(task_id=TASK_ID, attempt=3),
    "DrainNotice": m.DrainNotice(drain=True, reason="kernel update"),
    "ErrorBody": m.ErrorBody(
        error=m.ErrorDetail(
            code="invalid_request", message="bad", details={"errors": [{"path": "plan", "message": "Field required"}]}
        )
    ),
}
