"""devsched.store: the Postgres repository; one transaction per domain operation."""

from devsched.store.clock import Clock, DatabaseClock, ManualClock
from devsched.store.engine import DatabaseTimeouts, make_engine
from devsched.store.repository import Store
from devsched.store.views import (
    AssignmentMessage,
    AttemptView,
    CancelReceipt,
    DeviceSpec,
    DeviceView,
    ExpiredLease,
    HostView,
    NewTask,
    OutboxMessage,
    ReportReceipt,
    Submitted,
    TaskPage,
    TaskView,
)

__all__ = [
    "AssignmentMessage",
    "AttemptView",
    "CancelReceipt",
    "Clock",
    "DatabaseClock",
    "DatabaseTimeouts",
    "DeviceSpec",
    "DeviceView",
    "ExpiredLease",
    "HostView",
    "ManualClock",
    "NewTask",
    "OutboxMessage",
    "ReportReceipt",
    "Store",
    "Submitted",
    "TaskPage",
    "TaskView",
    "make_engine",
]
