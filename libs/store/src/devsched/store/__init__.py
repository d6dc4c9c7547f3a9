"""devsched.store: the Postgres repository; each domain operation applied whole (a transaction, or one statement)."""

from devsched.store.clock import Clock, DatabaseClock, ManualClock
from devsched.store.engine import DatabaseTimeouts, make_engine
from devsched.store.outbox import PublishBatch, Published
from devsched.store.queries import task_cursor
from devsched.store.repository import Store
from devsched.store.views import (
    ActionSpec,
    CancelReceipt,
    Committed,
    DeviceSpec,
    ExpiredLease,
    HostReport,
    NewTask,
    OutboxMessage,
    ReleaseReceipt,
    ReportReceipt,
    Submitted,
    Unclaimed,
)

__all__ = [
    "ActionSpec",
    "CancelReceipt",
    "Clock",
    "Committed",
    "DatabaseClock",
    "DatabaseTimeouts",
    "DeviceSpec",
    "ExpiredLease",
    "HostReport",
    "ManualClock",
    "NewTask",
    "OutboxMessage",
    "PublishBatch",
    "Published",
    "ReleaseReceipt",
    "ReportReceipt",
    "Store",
    "Submitted",
    "Unclaimed",
    "make_engine",
    "task_cursor",
]
