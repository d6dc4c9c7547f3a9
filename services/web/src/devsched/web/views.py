"""Pure view-model functions: what a page shows, computed from the API's models with no I/O and no clock.

Templates only format what these return. Nothing here ever carries a lease id (a fencing token of a
running attempt) or a credential: attempts become `AttemptRow`s without one, and free-form JSON goes
through `redact` first.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from urllib.parse import quote, urlencode

from devsched.client.errors import InvalidRequest
from devsched.client.task_ids import task_ref
from devsched.core import actions as core_actions
from devsched.core.ids import is_token
from devsched.core.status import IN_FLIGHT, TERMINAL, TaskKind, TaskStatus
from devsched.protocol.messages import (
    AttemptView,
    DeviceView,
    HostView,
    Progress,
    ResultsSummary,
    TaskEvent,
    TaskSummary,
    TaskView,
)

#: Device states the lab colours, in legend order. `quarantined` is reserved for the device health checks
#: being built: a device whose state says it is coloured as such (no API carries it yet).
DEVICE_STATES = ("available", "reserved", "offline", "drained", "quarantined")
#: Shown instead of a hidden value.
HIDDEN = "•••"
#: Keys whose values are never rendered (case-insensitive substring match).
SECRET_KEY = re.compile(r"(secret|token|passw|credential|creds|api[_-]?key|private|lease)", re.IGNORECASE)
#: A UUID, as lease ids are written.
UUID_TEXT = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")


def device_state(device: DeviceView, host_online: bool) -> str:
    """The state the lab colours a device with: one of `DEVICE_STATES` (unknown states pass through).

    An offline host's devices are offline whatever their rows say, except drained and quarantined ones (an
    operator's or the scheduler's decision outlives the host's absence).
    """
    state = str(device.state)
    if device.drained or state == "drained":
        return "drained"  # the operator's act shows first, as the scheduler's `state` does
    if device.quarantined or state == "quarantined":
        return "quarantined"
    if not host_online:
        return "offline"
    return state


def state_class(state: str) -> str:
    """The CSS class of a device or task state (unknown ones get the neutral colour)."""
    known = {*DEVICE_STATES, *(s.value for s in TaskStatus)}
    return f"state-{state}" if state in known else "state-unknown"


def age(since: datetime, now: datetime) -> str:
    """A short age: `45s`, `12m`, `3h05m`, `2d4h` (never negative: a clock ahead shows `0s`)."""
    seconds = max(0, int((now - since).total_seconds()))
    if seconds < 60:
        return f"{seconds}s"
    minutes = seconds // 60
    if minutes < 60:
        return f"{minutes}m"
    hours = minutes // 60
    if hours < 48:
        return f"{hours}h{minutes % 60:02d}m"
    return f"{hours // 24}d{hours % 24}h"


def parse_label_filters(values: Iterable[str]) -> dict[str, str]:
    """`key=value` filters from the query string; malformed ones (no `=`, empty key) are ignored."""
    filters: dict[str, str] = {}
    for raw in values:
        key, sep, value = raw.partition("=")
        if sep and key.strip():
            filters[key.strip()] = value.strip()
    return filters


def matches(labels: Mapping[str, str], filters: Mapping[str, str]) -> bool:
    """Whether a device with `labels` has every `key=value` of `filters`."""
    return all(labels.get(k) == v for k, v in filters.items())


def redact(value: Any) -> Any:
    """A copy of JSON-like `value` with the values of secret-looking keys replaced by `HIDDEN`."""
    if isinstance(value, Mapping):
        return {k: HIDDEN if SECRET_KEY.search(str(k)) else redact(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [redact(v) for v in value]
    return value


def hide_lease_ids(text: str, lease_ids: Iterable[str]) -> str:
    """`text` with each of `lease_ids` replaced (a step may print its `DEVSCHED_LEASE_ID`)."""
    for lease_id in lease_ids:
        if lease_id:
            text = text.replace(lease_id, HIDDEN)
    return text


class LeaseMask:
    """`hide_lease_ids` over a stream of bytes: a lease id cut between two chunks is masked too.

    What may be the start of a lease id is held back until the next chunk (or `flush`) says otherwise.
    """

    def __init__(self, lease_ids: Iterable[str]) -> None:
        self._ids = [i.encode() for i in lease_ids if i]
        self._keep = max((len(i) for i in self._ids), default=1) - 1
        self._held = b""

    def feed(self, chunk: bytes) -> bytes:
        """What of `chunk` (after what was held) can be sent now, lease ids masked."""
        data = self._mask(self._held + chunk)
        cut = len(data) - self._keep if self._keep else len(data)
        cut = max(0, cut)
        self._held = data[cut:]
        return data[:cut]

    def flush(self) -> bytes:
        """The rest held back."""
        rest, self._held = self._held, b""
        return rest

    def _mask(self, data: bytes) -> bytes:
        for lease_id in self._ids:
            data = data.replace(lease_id, HIDDEN.encode())
        return data


def progress_text(progress: Progress | None) -> str:
    """`step 2/5: build` or an empty string."""
    if progress is None:
        return ""
    return f"step {progress.index + 1}/{progress.of}: {progress.step}"


# -- lab ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Running:
    """What runs on a reserved device, as the lab shows it."""

    task_id: str
    name: str | None
    attempt: int
    progress: Progress | None = None

    @property
    def step(self) -> str:
        """The current step, for the device's cell."""
        return progress_text(self.progress)


@dataclass(frozen=True, slots=True)
class DeviceCell:
    """One device of the lab grid."""

    device_id: str
    host_id: str
    state: str
    labels: dict[str, str]
    drained: bool
    drain_reason: str | None
    running: Running | None

    @property
    def css(self) -> str:
        """Its colour class."""
        return state_class(self.state)


@dataclass(frozen=True, slots=True)
class HostRow:
    """A host with its device cells, as the lab shows it."""

    host_id: str
    online: bool
    last_seen: str
    agent_version: str | None
    devices: list[DeviceCell]
    plugin_actions: list[str] = field(default_factory=list)
    """The plug-in actions it advertises (built-ins left out: every host runs those)."""


@dataclass(frozen=True, slots=True)
class Lab:
    """The lab page: hosts, state counts, the labels to filter by, the active filters."""

    hosts: list[HostRow]
    counts: dict[str, int]
    label_choices: dict[str, list[str]]
    filters: dict[str, str]
    devices_shown: int
    devices_total: int


def lab(
    hosts: Sequence[HostView],
    running: Mapping[str, Running],
    filters: Mapping[str, str],
    now: datetime,
) -> Lab:
    """The lab from the hosts list and what runs on each device (`running`, by device id).

    Counts are over every device; the grid holds only the devices matching `filters` (hosts with none
    are left out while a filter is on).
    """
    counts = dict.fromkeys(DEVICE_STATES, 0)
    choices: dict[str, set[str]] = {}
    rows: list[HostRow] = []
    shown = total = 0
    for host in sorted(hosts, key=lambda h: h.host_id):
        cells: list[DeviceCell] = []
        for device in sorted(host.devices, key=lambda d: d.device_id):
            state = device_state(device, host.online)
            counts[state] = counts.get(state, 0) + 1
            total += 1
            for key, value in device.labels.items():
                choices.setdefault(key, set()).add(value)
            if not matches(device.labels, filters):
                continue
            shown += 1
            cells.append(
                DeviceCell(
                    device_id=device.device_id,
                    host_id=host.host_id,
                    state=state,
                    labels=dict(device.labels),
                    drained=device.drained,
                    drain_reason=device.drain_reason,
                    running=running.get(device.device_id) if state in ("reserved", "drained") else None,
                )
            )
        if cells or not filters:
            rows.append(
                HostRow(
                    host.host_id,
                    host.online,
                    age(host.last_seen_at, now),
                    host.agent_version,
                    cells,
                    plugin_actions(host),
                )
            )
    return Lab(
        hosts=rows,
        counts=counts,
        label_choices={k: sorted(v) for k, v in sorted(choices.items())},
        filters=dict(filters),
        devices_shown=shown,
        devices_total=total,
    )


def plugin_actions(host: HostView) -> list[str]:
    """The host's advertised plug-in actions by name, built-ins (`shell`, `sleep`, `noop`) left out."""
    return core_actions.plugin_actions(a.name for a in host.actions)


# -- queue -------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TaskRow:
    """A task in a queue table."""

    task_id: str
    name: str
    status: str
    priority: int
    age: str
    pending_reason: str
    attempt: str
    step: str
    reason: str

    @property
    def css(self) -> str:
        """Its colour class."""
        return state_class(self.status)


def task_row(task: TaskSummary, now: datetime, progress: Progress | None = None) -> TaskRow:
    """One row of the queue page."""
    return TaskRow(
        task_id=str(task.task_id),
        name=task.name or "",
        status=str(task.status),
        priority=task.priority,
        age=age(task.created_at, now),
        pending_reason=task.pending_reason or "",
        attempt=f"{task.attempt_count}/{task.max_attempts}" if task.attempt_count else "",
        step=progress_text(progress),
        reason=task.reason or "",
    )


@dataclass(frozen=True, slots=True)
class Window:
    """One page of a long table: rows `start` to `stop` (exclusive) of `total`, pages numbered from 1."""

    page: int
    pages: int
    start: int
    stop: int
    total: int

    @property
    def more(self) -> int:
        """Rows after this page."""
        return self.total - self.stop

    @property
    def previous(self) -> int | None:
        """The page before, if any."""
        return self.page - 1 if self.page > 1 else None

    @property
    def next(self) -> int | None:
        """The page after, if any."""
        return self.page + 1 if self.page < self.pages else None


def window(total: int, page: int, size: int) -> Window:
    """Page `page` (clamped to the pages there are) of `total` rows, `size` a page."""
    pages = max(1, -(-total // size))
    page = min(max(1, page), pages)
    start = (page - 1) * size
    return Window(page=page, pages=pages, start=start, stop=min(total, start + size), total=total)


def page_number(raw: str | None) -> int:
    """`?page=N` as a page number; anything else is page 1."""
    if raw is None or not raw.isdigit() or len(raw) > 6:
        return 1
    return max(1, int(raw))


@dataclass(frozen=True, slots=True)
class QueueFilters:
    """The Queue's filters from its query string (`?status=queued&kind=user&device=d1&id=3af5939c`).

    With any of them set the Queue lists the matching tasks of every status, newest first, from
    `P.api.tasks.list` a page at a time (`after`, the listing's cursor), instead of the sampled queue.
    """

    status: str | None = None
    kind: str | None = None
    device: str | None = None
    id_prefix: str | None = None
    after: str | None = None
    """The cursor of the page shown (`next` of the one before); None for the first page."""

    @property
    def active(self) -> bool:
        """Whether any filter is set (a cursor alone is none)."""
        return any((self.status, self.kind, self.device, self.id_prefix))

    def query(self, *, after: str | None = None) -> str:
        """The query string of these filters and the cursor `after` (`?status=queued&after=...`), or empty."""
        pairs = [
            (name, value)
            for name, value in (
                ("status", self.status),
                ("kind", self.kind),
                ("device", self.device),
                ("id", self.id_prefix),
                ("after", after),
            )
            if value
        ]
        return "?" + urlencode(pairs) if pairs else ""


#: The values the Queue's status and kind filters offer.
FILTER_STATUSES = tuple(s.value for s in TaskStatus)
FILTER_KINDS = tuple(k.value for k in TaskKind)


def queue_filters(params: Mapping[str, str]) -> tuple[QueueFilters, list[str]]:
    """The Queue's filters from the query string, and what is wrong with them (empty when nothing).

    Empty values are unset (the form sends them). A bad value is named in the problems and left out of
    the filters, and the caller lists nothing: a filter it could not apply never widens the list.
    """
    problems: list[str] = []

    def given(name: str) -> str | None:
        value = params.get(name, "").strip()
        return value or None

    status, kind, device, id_text, after = (given(n) for n in ("status", "kind", "device", "id", "after"))
    if status is not None and status not in FILTER_STATUSES:
        problems.append(f"status: {status[:40]!r} is not a task status ({', '.join(FILTER_STATUSES)})")
        status = None
    if kind is not None and kind not in FILTER_KINDS:
        problems.append(f"kind: {kind[:40]!r} is not a task kind ({', '.join(FILTER_KINDS)})")
        kind = None
    if device is not None and not is_token(device):
        problems.append(f"device: {device[:80]!r} is not a device id")
        device = None
    id_prefix = None
    if id_text is not None:
        try:
            id_prefix = str(task_ref(id_text, path="id"))
        except InvalidRequest:
            problems.append(f"id: {id_text[:80]!r} is not a task id or its first 8 or more hex digits")
    if after is not None and len(after) > 4096:
        problems.append("after: not a cursor of this listing")
        after = None
    return QueueFilters(status, kind, device, id_prefix, after), problems


def queue_order(tasks: Iterable[TaskSummary]) -> list[TaskSummary]:
    """Queued tasks in the order the scheduler takes them: higher priority first, then oldest first."""
    return sorted(tasks, key=lambda t: (-t.priority, t.created_at))


# -- task --------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Mark:
    """One point of an attempt's timeline."""

    what: str
    at: datetime
    detail: str = ""


@dataclass(frozen=True, slots=True)
class AttemptRow:
    """An attempt as the task page shows it: no lease id, ever."""

    attempt: int
    host_id: str
    device_id: str
    status: str
    end_reason: str
    report_reason: str
    cancel_requested: bool
    timeline: list[Mark]
    results: list[tuple[str, ResultsSummary]] = field(default_factory=list)
    steps: list[StepTime] = field(default_factory=list)
    """How long each step the attempt reached took (or, running, has taken so far)."""

    @property
    def css(self) -> str:
        """Its colour class (attempt statuses share the task palette; `active` is running)."""
        palette = {"active": "dispatched", "expired": "failed", "released": "queued"}
        return state_class(palette.get(self.status, self.status))


@dataclass(frozen=True, slots=True)
class StepTime:
    """One step of an attempt as its events time it: from its `progress` event to the next one (or the end)."""

    index: int
    """1-based position in the plan."""
    name: str
    started: datetime
    seconds: float | None
    """Its duration; for the running step the time since it started; None when unknown (no clock given)."""
    running: bool

    @property
    def text(self) -> str:
        """`1.2 s`, `45 s`, `3m05s`, `1h02m` (`running 12 s` while it runs); empty when unknown."""
        if self.seconds is None:
            return ""
        shown = duration_text(self.seconds)
        return f"running {shown}" if self.running else shown


def duration_text(seconds: float) -> str:
    """A duration for people: `0.4 s`, `12.3 s`, `45 s`, `3m05s`, `1h02m` (never negative)."""
    seconds = max(0.0, seconds)
    if seconds < 10:
        return f"{seconds:.1f} s"
    if seconds < 60:
        return f"{int(seconds)} s"
    minutes = int(seconds // 60)
    if minutes < 60:
        return f"{minutes}m{int(seconds % 60):02d}s"
    return f"{minutes // 60}h{minutes % 60:02d}m"


def step_times(attempt: AttemptView, events: Sequence[TaskEvent], now: datetime | None) -> list[StepTime]:
    """The steps an attempt reached, timed by its `progress` events' commit times.

    A step ends when the next one starts, or when the attempt ends; the last step of an attempt still
    running is timed up to `now`. The times are those of the events, so a step shorter than the host's
    progress reports may be missing or merged into its neighbour.
    """
    starts: dict[int, tuple[datetime, str]] = {}
    for event in events:
        if event.attempt == attempt.attempt and event.event == "progress" and event.progress is not None:
            index = event.progress.index
            if index not in starts or event.at < starts[index][0]:
                starts[index] = (event.at, event.progress.step)
    ordered = sorted(starts.items(), key=lambda item: (item[1][0], item[0]))
    rows: list[StepTime] = []
    for i, (index, (started, name)) in enumerate(ordered):
        running = False
        if i + 1 < len(ordered):
            until: datetime | None = ordered[i + 1][1][0]
        elif attempt.ended_at is not None:
            until = attempt.ended_at
        else:
            until, running = now, True
        seconds = (until - started).total_seconds() if until is not None else None
        rows.append(StepTime(index + 1, name, started, seconds, running))
    return rows


def attempt_row(attempt: AttemptView, events: Sequence[TaskEvent], now: datetime | None = None) -> AttemptRow:
    """An attempt's row: assigned, dispatched, the steps its events show, its end (with the reason).

    `now` times the running step (see `step_times`).
    """
    marks = [Mark("assigned", attempt.assigned_at, f"{attempt.host_id} / {attempt.device_id}")]
    if attempt.dispatched_at is not None:
        marks.append(Mark("dispatched", attempt.dispatched_at))
    for event in events:
        if event.attempt == attempt.attempt and event.event == "progress" and event.progress is not None:
            marks.append(Mark("step", event.at, progress_text(event.progress)))
        elif event.attempt == attempt.attempt and event.event == "cancel_requested":
            marks.append(Mark("cancel requested", event.at, event.reason or ""))
    if attempt.ended_at is not None:
        marks.append(Mark("ended", attempt.ended_at, str(attempt.end_reason or attempt.status)))
    marks.sort(key=lambda m: m.at)
    return AttemptRow(
        attempt=attempt.attempt,
        host_id=attempt.host_id,
        device_id=attempt.device_id,
        status=str(attempt.status),
        end_reason=str(attempt.end_reason or ""),
        report_reason=attempt.report_reason or "",
        cancel_requested=attempt.cancel_requested,
        timeline=marks,
        steps=step_times(attempt, events, now),
    )


def result_summaries(task: TaskSummary) -> list[tuple[str, ResultsSummary]]:
    """Each step's test-result summary from the result that ended the task, by step name."""
    if task.result is None:
        return []
    return [(step.name, step.results) for step in task.result.steps if step.results is not None]


def step_rows(task: TaskSummary) -> list[dict[str, Any]]:
    """The plan's steps for display: environment values hidden, other arguments redacted."""
    rows = []
    for index, step in enumerate(task.plan.steps):
        args = dict(step.args)
        env = args.pop("env", None)
        shown = redact(args)
        if isinstance(env, Mapping):
            shown["env"] = dict.fromkeys(sorted(env), HIDDEN)
        rows.append(
            {
                "index": index + 1,
                "name": step.name,
                "action": step.action,
                "args": shown,
                "timeout_s": step.timeout_s,
                "always": step.always,
            }
        )
    return rows


def pending_parts(reason: str | None) -> tuple[str, str]:
    """A `pending_reason` split into its stable code and its explanation (`retry_backoff`, `attempt 1 ...`).

    The scheduler writes `<code>: <words>`; codes include `retry_backoff` (the retry policy's wait, see
    `not_before`) and `no_host_with_action` (no host with a matching device offers a plug-in action the plan
    uses). A reason without a code is all explanation.
    """
    if not reason:
        return "", ""
    code, sep, words = reason.partition(": ")
    if sep and code.isidentifier():
        return code, words
    return "", reason


@dataclass(frozen=True, slots=True)
class ArtifactRow:
    """A stored artifact as the task page lists it, with its download path on this dashboard."""

    attempt: int
    name: str
    step: str
    size: int
    sha256: str
    href: str


def download_path(task_id: object, attempt: int, name: str) -> str:
    """`/tasks/<id>/artifacts/<attempt>/<name>`, the name's parts percent-encoded (slashes kept)."""
    return f"/tasks/{task_id}/artifacts/{attempt}/{quote(name, safe='/')}"


def artifacts(task: TaskView) -> list[ArtifactRow]:
    """The task's stored artifacts, newest attempt first, then by name."""
    rows = [
        ArtifactRow(a.attempt, a.name, a.step, a.size, a.sha256, download_path(task.task_id, a.attempt, a.name))
        for a in task.artifacts
    ]
    return sorted(rows, key=lambda r: (-r.attempt, r.name))


def size_text(size: int) -> str:
    """`512 B`, `12.3 KiB`, `4.0 MiB`, `1.2 GiB`."""
    if size < 1024:
        return f"{size} B"
    value = float(size)
    for unit in ("KiB", "MiB", "GiB"):
        value /= 1024
        if value < 1024 or unit == "GiB":
            break
    return f"{value:.1f} {unit}"


def seconds_text(seconds: float) -> str:
    """`45 s`, `1.5 s`, `12m`, `2h05m` for a duration in seconds."""
    if seconds < 60:
        return f"{seconds:g} s"
    minutes = int(seconds // 60)
    if minutes < 60:
        return f"{minutes}m" + (f"{int(seconds % 60):02d}s" if seconds % 60 else "")
    return f"{minutes // 60}h{minutes % 60:02d}m"


def policy_rows(task: TaskSummary) -> list[tuple[str, str]]:
    """The task's retry policy and time limits as (label, text) pairs; empty when it has none."""
    rows: list[tuple[str, str]] = []
    if task.retry is not None:
        b = task.retry.backoff
        causes = ", ".join(str(c) for c in task.retry.on) or "nothing"
        rows.append(("Retried on", causes))
        rows.append(
            ("Backoff", f"{seconds_text(b.initial_s)} ×{b.multiplier:g} per retry, at most {seconds_text(b.max_s)}")
        )
    if task.queue_timeout_s is not None:
        rows.append(("Queue timeout", seconds_text(task.queue_timeout_s)))
    if task.attempt_timeout_s is not None:
        rows.append(("Attempt timeout", seconds_text(task.attempt_timeout_s)))
    return rows


def cancellable(status: str) -> bool:
    """Whether cancel means anything for a task in `status`."""
    return status not in {s.value for s in TERMINAL}


def resubmittable(task: TaskSummary) -> bool:
    """Whether a task may be resubmitted: a user's task (health checks are the scheduler's)."""
    return str(task.kind) != TaskKind.HEALTH.value


def in_flight(status: str) -> bool:
    """Whether a task in `status` holds a device."""
    return status in {s.value for s in IN_FLIGHT}


#: Tasks per page of a device's history.
HISTORY_PAGE = 50


@dataclass(frozen=True, slots=True)
class HistoryRow:
    """One task of a device's history (issue 15): a user task or a health check, newest first."""

    task_id: str
    label: str
    health: bool
    status: str
    at: datetime
    reason: str | None


def device_history(tasks: Iterable[TaskSummary]) -> list[HistoryRow]:
    """A page of `P.api.tasks.list(device_id=...)` as the Device page shows it.

    `at` is the task's last change (when it ended, for a finished one); a health check is labelled by its
    name (`health:<check>`), a user task by its name or the start of its id.
    """
    rows = []
    for task in tasks:
        task_id = str(task.task_id)
        rows.append(
            HistoryRow(
                task_id=task_id,
                label=task.name or task_id[:8],
                health=str(task.kind) == "health",
                status=str(task.status),
                at=task.updated_at,
                reason=task.reason,
            )
        )
    return rows


def more_path(device_id: str, cursor: str | None) -> str | None:
    """The link to the next page of a device's history, or None on the last page."""
    if cursor is None:
        return None
    return f"/devices/{quote(device_id, safe='')}?after={quote(cursor, safe='')}"
