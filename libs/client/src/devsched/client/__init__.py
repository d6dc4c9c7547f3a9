"""devsched.client: the async Python client of devsched, and the `devsched` command line.

```python
from devsched.client import Client, NotFound

async with Client.connect("nats://127.0.0.1:4222") as client:
    reply = await client.submit_file("plan.yaml", selector={"platform": "android"})
    view = await client.wait(reply.task_id)
```

Replies are the protocol's models (`devsched.protocol.messages`); failures are typed `DevschedError`s
carrying the protocol's `code` and, for 400s, field paths (`devsched.client.errors`).

Each name is imported when first used, so that `devsched --version` need not load the client.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from devsched.client.lazy import lazy_attributes

if TYPE_CHECKING:
    from devsched.client.client import DEFAULT_NATS_URL, DEFAULT_TIMEOUT_S, Client, task_uuid, wait_for_scheduler
    from devsched.client.errors import (
        Conflict,
        DevschedError,
        Internal,
        InvalidRequest,
        NatsUnreachable,
        NoReply,
        NotFound,
        PlanFileError,
        TaskTerminal,
        TooLarge,
        Unavailable,
        describe,
        field_errors,
    )
    from devsched.client.logs import LogReader, collect_output
    from devsched.client.plans import build_request, load_document, load_request
    from devsched.client.task_ids import AmbiguousTaskId
    from devsched.client.watch import TaskWatch
    from devsched.core.status import TERMINAL, DeviceState, EventKind, TaskStatus
    from devsched.protocol.messages import (
        CancelReply,
        DeviceDrainView,
        HostView,
        ListTasksReply,
        LogKind,
        LogRecord,
        OutputStream,
        Plan,
        Selector,
        Step,
        SubmitReply,
        SubmitRequest,
        TaskEvent,
        TaskSummary,
        TaskView,
    )

__all__ = [
    "DEFAULT_NATS_URL",
    "DEFAULT_TIMEOUT_S",
    "TERMINAL",
    "AmbiguousTaskId",
    "CancelReply",
    "Client",
    "Conflict",
    "DeviceDrainView",
    "DeviceState",
    "DevschedError",
    "EventKind",
    "HostView",
    "Internal",
    "InvalidRequest",
    "ListTasksReply",
    "LogKind",
    "LogReader",
    "LogRecord",
    "NatsUnreachable",
    "NoReply",
    "NotFound",
    "OutputStream",
    "Plan",
    "PlanFileError",
    "Selector",
    "Step",
    "SubmitReply",
    "SubmitRequest",
    "TaskEvent",
    "TaskStatus",
    "TaskSummary",
    "TaskTerminal",
    "TaskView",
    "TaskWatch",
    "TooLarge",
    "Unavailable",
    "build_request",
    "collect_output",
    "describe",
    "field_errors",
    "load_document",
    "load_request",
    "task_uuid",
    "wait_for_scheduler",
]

#: The module each public name comes from.
_SOURCES = {
    **dict.fromkeys(("DEFAULT_NATS_URL", "DEFAULT_TIMEOUT_S", "Client", "task_uuid", "wait_for_scheduler"),
                    "devsched.client.client"),
    **dict.fromkeys(("Conflict", "DevschedError", "Internal", "InvalidRequest", "NatsUnreachable", "NoReply",
                     "NotFound", "PlanFileError", "TaskTerminal", "TooLarge", "Unavailable", "describe",
                     "field_errors"), "devsched.client.errors"),
    **dict.fromkeys(("LogReader", "collect_output"), "devsched.client.logs"),
    **dict.fromkeys(("build_request", "load_document", "load_request"), "devsched.client.plans"),
    "AmbiguousTaskId": "devsched.client.task_ids",
    "TaskWatch": "devsched.client.watch",
    **dict.fromkeys(("TERMINAL", "DeviceState", "EventKind", "TaskStatus"), "devsched.core.status"),
    **dict.fromkeys(("CancelReply", "DeviceDrainView", "HostView", "ListTasksReply", "LogKind", "LogRecord",
                     "OutputStream", "Plan", "Selector", "Step", "SubmitReply", "SubmitRequest", "TaskEvent",
                     "TaskSummary", "TaskView"), "devsched.protocol.messages"),
}  # fmt: skip


__getattr__ = lazy_attributes(globals(), _SOURCES)
