"""Store values to protocol replies, and protocol requests to store values."""

from __future__ import annotations

from typing import Any

from devsched.core.records import Selector as CoreSelector
from devsched.protocol import messages as m
from devsched.store import AttemptView, HostView, NewTask, TaskView


def new_task(req: m.SubmitRequest) -> NewTask:
    """The store's submit value of a validated request (plan normalised with its defaults)."""
    return NewTask(
        plan=req.plan.model_dump(mode="json"),
        name=req.name,
        selector=CoreSelector(labels=dict(req.selector.labels), device_id=req.selector.device_id),
        priority=req.priority,
        max_attempts=req.max_attempts,
        lease_ttl_s=req.lease_ttl_s,
        idempotency_key=req.idempotency_key,
        metadata=dict(req.metadata),
    )


def _summary_fields(view: TaskView) -> dict[str, Any]:
    return {
        "task_id": view.task_id,
        "name": view.name,
        "status": view.status,
        "priority": view.priority,
        "max_attempts": view.max_attempts,
        "attempt_count": view.attempt_count,
        "cancel_requested": view.cancel_requested,
        "selector": {"labels": dict(view.selector.labels), "device_id": view.selector.device_id},
        "plan": dict(view.plan),
        "created_at": view.created_at,
        "updated_at": view.updated_at,
        "reason": view.reason,
        "result": dict(view.result) if view.result is not None else None,
        "pending_reason": view.pending_reason,
        "lease_ttl_s": view.lease_ttl_s,
        "idempotency_key": view.idempotency_key,
        "metadata": dict(view.metadata),
    }


def _attempt(view: AttemptView) -> dict[str, Any]:
    return {
        "attempt": view.attempt,
        "lease_id": view.lease_id,
        "host_id": view.host_id,
        "device_id": view.device_id,
        "status": view.status,
        "assigned_at": view.assigned_at,
        "dispatched_at": view.dispatched_at,
        "expires_at": view.expires_at,
        "ended_at": view.ended_at,
        "end_reason": view.end_reason,
        "progress": dict(view.progress) if view.progress is not None else None,
        "cancel_requested": view.cancel_requested,
        "report_reason": view.report_reason,
        "result": dict(view.result) if view.result is not None else None,
    }


def task_summary(view: TaskView) -> m.TaskSummary:
    """A listed task (no attempts)."""
    return m.TaskSummary.model_validate(_summary_fields(view))


def task_view(view: TaskView) -> m.TaskView:
    """The full task view with every attempt."""
    return m.TaskView.model_validate({**_summary_fields(view), "attempts": [_attempt(a) for a in view.attempts]})


def hosts(views: tuple[HostView, ...]) -> m.HostsListReply:
    """The hosts listing."""
    return m.HostsListReply.model_validate(
        {
            "hosts": [
                {
                    "host_id": h.host_id,
                    "online": h.online,
                    "last_seen_at": h.last_seen_at,
                    "agent_version": h.agent_version,
                    "devices": [
                        {
                            "device_id": d.device_id,
                            "labels": dict(d.labels),
                            "state": d.state,
                            "drained": d.drained,
                            "drain_reason": d.drain_reason,
                        }
                        for d in h.devices
                    ],
                }
                for h in views
            ]
        }
    )
