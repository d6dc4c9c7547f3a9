"""Replies that fit: list pages cut by bytes as well as by count, task views trimmed with a flag.

NATS carries no message above its server's `max_payload` (1 MiB by default): a reply above it is never
sent, and the caller waits for nothing. Any one request is bounded (`DEVSCHED_MAX_PAYLOAD_BYTES`), but a
reply gathers many: a page of tasks each holding 400 KiB of metadata, a task whose report brought long
output tails on top of its metadata, thousands of hosts. So every list reply ends its page, with a `next`
cursor, before the next item would pass the budget (`transport.reply_limit`: the server's `max_payload`
less room for headers); a list shows a task's large fields cut (`LIST_FIELD_BYTES`), named in its
`truncated`; a task view too large for one reply is cut field by field (`trim_view`) unless the caller
asked for the field `full`; and a `reports` reply answers the reports past its budget 503 (`fit_reports`).
What still does not fit is answered `reply_too_large` by the transport.

Every field a request brought in fits a reply by itself (the request limit is below NATS's), so an item
trimmed this way always fits alone, and a page always holds at least one item.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
from collections.abc import Callable, Collection, Sequence
from typing import Any, TypeVar

from pydantic import BaseModel

from devsched.core.errors import InvalidRequest, Unavailable
from devsched.protocol import messages as m
from devsched.protocol.codec import encode

log = logging.getLogger("devsched.scheduler.replies")

M = TypeVar("M", bound=BaseModel)

#: In a list, a task's `metadata` or `result` above this many bytes (encoded) is cut and flagged.
LIST_FIELD_BYTES = 4 * 1024
#: What is kept of each step's `output_tail` in a cut result: its end, in characters.
LIST_TAIL_CHARS = 512
VIEW_TAIL_CHARS = 4 * 1024
#: Room kept in a page for the cursor and the reply's other fields.
_ENVELOPE_BYTES = 1024


def size(model: BaseModel) -> int:
    """Bytes of `model` on the wire."""
    return len(encode(model))


def fit(items: Sequence[BaseModel], budget: int) -> int:
    """How many of `items`, in order, a reply of at most `budget` bytes holds: at least one, when any."""
    used = _ENVELOPE_BYTES
    for n, item in enumerate(items):
        used += size(item) + 1  # and its comma
        if used > budget and n > 0:
            return n
    return len(items)


def fit_reports(outcomes: list[m.ReportOutcome], budget: int) -> list[m.ReportOutcome]:
    """A `reports` reply's outcomes within `budget`: those past what it holds answered 503 `unavailable`.

    Each report is recorded by then, and a hand-over carries its task's plan, so many may not fit in one
    reply. Sent again, such a report is a duplicate, answered with its first answer (its hand-over
    included) in a reply of its own; the first outcome is always kept.
    """
    n = fit(outcomes, budget)
    if n == len(outcomes):
        return outcomes
    again = Unavailable("the answer to this report did not fit in the reply; send the report again")
    error = m.ErrorDetail(code=again.code, message=again.message, details=again.details)
    log.warning("reports answered in part: the reply would not fit", extra={"answered": n, "reports": len(outcomes)})
    return outcomes[:n] + [
        m.ReportOutcome(task_id=o.task_id, attempt=o.attempt, lease_id=o.lease_id, error=error) for o in outcomes[n:]
    ]


def _json_size(value: Any) -> int:
    return len(json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode())


def _cut_result(result: m.RunResult | None, tail_chars: int | None) -> m.RunResult | None:
    """`result` with each step's output tail cut to its last `tail_chars` characters (None: left out)."""
    if result is None:
        return None
    steps = []
    for step in result.steps:
        tail = step.output_tail
        if tail is not None and (tail_chars is None or len(tail) > tail_chars):
            tail = None if tail_chars is None else tail[-tail_chars:]
        steps.append(step.model_copy(update={"output_tail": tail}))
    return result.model_copy(update={"steps": steps})


def _flagged(model: M, field: str, update: dict[str, Any]) -> M:
    truncated = list(getattr(model, "truncated", []))
    if field not in truncated:
        truncated.append(field)
    return model.model_copy(update={**update, "truncated": truncated})


def list_item(task: m.TaskSummary) -> m.TaskSummary:
    """`task` as a list shows it: `metadata` and `result` above `LIST_FIELD_BYTES` cut, and flagged."""
    if task.metadata and _json_size(task.metadata) > LIST_FIELD_BYTES:
        task = _flagged(task, "metadata", {"metadata": {}})
    if task.result is not None and size(task.result) > LIST_FIELD_BYTES:
        task = _flagged(task, "result", {"result": _cut_result(task.result, LIST_TAIL_CHARS)})
    return task


def _cuts(view: m.TaskView) -> list[tuple[str, Callable[[m.TaskView], dict[str, Any]]]]:
    """The cuts of a view, mildest first: each the field it cuts and its new value."""
    return [
        ("result", lambda v: {"result": _cut_result(v.result, VIEW_TAIL_CHARS)}),
        ("attempts", lambda v: {"attempts": [a.model_copy(update={"result": None}) for a in v.attempts]}),
        ("artifacts", lambda v: {"artifacts": []}),
        ("metadata", lambda v: {"metadata": {}}),
        ("result", lambda v: {"result": _cut_result(v.result, None)}),
    ]


def trim_view(view: m.TaskView, budget: int, full: Collection[str] = ()) -> m.TaskView:
    """`view` cut, mildest cut first, until it fits `budget` bytes; the fields in `full` are never cut."""
    for field, cut in _cuts(view):
        if size(view) <= budget:
            break
        update = cut(view)
        if field not in full and any(getattr(view, name) != value for name, value in update.items()):
            view = _flagged(view, field, update)  # flagged only when something was cut
    return view


def encode_key(key: Sequence[Any]) -> str:
    """An opaque cursor for an item's sort key (a JSON list, base64url)."""
    return base64.urlsafe_b64encode(json.dumps(list(key)).encode()).decode().rstrip("=")


def decode_key(cursor: str, types: tuple[type, ...]) -> tuple[Any, ...]:
    """The sort key of a cursor made by `encode_key`, whose parts are of `types`.

    Raises:
        InvalidRequest: not such a cursor (path `after`).
    """
    try:
        key = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
    except (binascii.Error, UnicodeDecodeError, ValueError):
        key = None
    if not (
        isinstance(key, list)
        and len(key) == len(types)
        and all(type(part) is t for part, t in zip(key, types, strict=True))
    ):
        raise InvalidRequest(
            "invalid cursor", errors=[{"path": "after", "message": "not a cursor returned by this endpoint"}]
        )
    return tuple(key)
