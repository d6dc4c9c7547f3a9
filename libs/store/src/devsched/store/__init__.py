"""devsched.store: the Postgres repository; one transaction per domain operation."""

from devsched.store.clock import Clock, DatabaseClock, ManualClock
from devsched.store.engine import DatabaseTimeouts, make_engine
from devsched.store.outbox import PublishBatch, Published
from devsched.store.repository import Store
from devsched.store.views import (
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
    "PublishBatch",
    "Published",
    "ReportReceipt",
    "Store",
    "Submitted",
    "TaskPage",
    "TaskView",
    "make_engine",
]
