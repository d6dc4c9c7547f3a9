r"""How tasks, hosts and events look in a terminal (rich tables and one-line summaries).

Every string that comes from the server (a host's labels, a task's name and reasons, a step's output) is
printed through `literal`: as a `Text`, never as a markup string, so `[/x]` or `[link=...]` shows as written
and cannot fail the command or hide a link; and with its control characters made visible (`visible`), so
an escape sequence is shown as `\x1b[2J` instead of clearing the operator's screen.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime

from rich import box
from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from devsched.client.resubmit import resubmit_of
from devsched.core.status import DeviceState, TaskKind, TaskStatus
from devsched.protocol.artifacts import ArtifactView
from devsched.protocol.health import HealthCheckView
from devsched.protocol.messages import HostView, ResultsSummary, TaskEvent, TaskSummary, TaskView

#: Colour of each task status.
STATUS_STYLE = {
    TaskStatus.QUEUED: "yellow",
    TaskStatus.ASSIGNED: "cyan",
    TaskStatus.DISPATCHED: "blue",
    TaskStatus.DONE: "green",
    TaskStatus.FAILED: "red",
    TaskStatus.CANCELLED: "magenta",
}
#: Colour of each device state.
DEVICE_STYLE = {
    DeviceState.AVAILABLE: "green",
    DeviceState.RESERVED: "blue",
    DeviceState.OFFLINE: "red",
    DeviceState.DRAINED: "yellow",
    DeviceState.QUARANTINED: "bold red",
}


#: What a terminal acts on rather than shows: the C0 controls (ESC starts colour, cursor, title and hyperlink
#: sequences; CR and backspace overwrite what was printed; BEL rings), DEL, the C1 controls (0x9b is a one-byte
#: CSI), the bidi formatting characters that reorder the text around them (U+202E), the line and paragraph
#: separators, and lone surrogates (which a UTF-8 terminal cannot be sent at all).
_CONTROL_RANGES = ((0x00, 0x1F), (0x7F, 0x9F), (0x061C, 0x061C), (0x200E, 0x200F), (0x2028, 0x202E),
                   (0x2066, 0x2069), (0xD800, 0xDFFF))  # fmt: skip
_CONTROL = re.compile("[" + "".join(f"{chr(a)}-{chr(b)}" for a, b in _CONTROL_RANGES) + "]")
#: The same but newline and tab: for text that is lines (a step's output).
_CONTROL_IN_LINES = re.compile(_CONTROL.pattern + "(?<![\t\n])")
#: Each of them as it is shown: `\t`, `\n`, `\r`, else `\xNN` or `\uNNNN`.
_ESCAPES = {
    chr(c): {0x09: r"\t", 0x0A: r"\n", 0x0D: r"\r"}.get(c) or (f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}")
    for a, b in _CONTROL_RANGES
    for c in range(a, b + 1)
}


def _escape(match: re.Match[str]) -> str:
    return _ESCAPES[match.group()]


def visible(text: str, *, lines: bool = False) -> str:
    r"""`text` with every control character as a visible escape (`\x1b`, `\r`, `\u202e`); `lines`: keep newline, tab.

    A backslash in `text` is kept as it is: what is shown can look like an escape, but never act as one.
    """
    return (_CONTROL_IN_LINES if lines else _CONTROL).sub(_escape, text)


def literal(text: object, style: str = "", *, lines: bool = False) -> Text:
    """`text` (a server-sourced value) to print exactly as written: no markup, no emoji codes, controls visible."""
    return Text(visible(str(text), lines=lines), style=style)


def status_text(status: TaskStatus | str) -> Text:
    """A task status in its colour."""
    return Text(str(status), style=STATUS_STYLE.get(TaskStatus(status), ""))


def when(value: datetime | None, *, now: datetime | None = None) -> str:
    """A timestamp as local `HH:MM:SS`, with the date when it is not today; `-` for none."""
    if value is None:
        return "-"
    local = value.astimezone()
    today = (now or datetime.now(UTC)).astimezone().date()
    return local.strftime("%H:%M:%S" if local.date() == today else "%Y-%m-%d %H:%M:%S")


def ago(value: datetime | None, *, now: datetime | None = None) -> str:
    """How long ago, as `4s`, `3m`, `2h`, `5d`."""
    if value is None:
        return "-"
    seconds = max(0.0, ((now or datetime.now(UTC)) - value).total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit}"
    return f"{int(seconds)}s"


def _name(task: TaskSummary) -> Text:
    """The task's name; a health check's (issue 13) in its own colour, with the device it checks."""
    if task.kind is TaskKind.HEALTH:
        return literal(f"{task.name or 'health'} @{task.health_device_id}", style="magenta")
    return literal(task.name or "")


def _note(task: TaskSummary) -> str:
    if task.status is TaskStatus.QUEUED and task.pending_reason:
        return task.pending_reason
    if task.cancel_requested:
        return "cancel requested"
    return task.reason or ""


#: Characters of a short task id: what `ls` shows where a whole id does not fit, and what any command takes back.
SHORT_ID_CHARS = 8


def short_id(task_id: object, chars: int = SHORT_ID_CHARS) -> str:
    """A task id's first `chars` characters (`3af5939c`): enough to name it in a lab's history."""
    return str(task_id)[:chars]


def short_id_chars(task_ids: Iterable[object]) -> int:
    """How much of each id to show so that no two of these look alike: 8 characters, or whole groups more."""
    ids = {str(task_id) for task_id in task_ids}
    for chars in (SHORT_ID_CHARS, 13, 18, 23):  # `3af5939c`, then up to each further hyphen of the id
        if len({task_id[:chars] for task_id in ids}) == len(ids):
            return chars
    return 36


def tasks_table(
    tasks: Iterable[TaskSummary], *, title: str | None = None, short_ids: bool = False, compact: bool = False
) -> Table:
    """The `ls` table: one row per task (`short_ids`: the first 8 characters of each id, more if two look alike).

    An id is never wrapped: cut over lines, it could not be copied (nor read) as one. `compact` is the layout
    for a terminal too narrow for the full table: no vertical rules, and the name, date and note may wrap, so
    rich shares the shortage among them instead of squeezing the few wrapping columns out of sight.
    """
    if compact:
        table = _compact_table(title)
        table.add_column("TASK", no_wrap=True)
        table.add_column("NAME", overflow="fold")
        table.add_column("STATUS", no_wrap=True)
        table.add_column("PRI", justify="right", no_wrap=True)
        table.add_column("ATTEMPTS", justify="right", no_wrap=True)
        table.add_column("CREATED", overflow="fold")
        table.add_column("NOTE", overflow="fold")
    else:
        table = Table(title=title, title_justify="left", expand=False)
        table.add_column("TASK", no_wrap=True)
        table.add_column("NAME", overflow="ellipsis" if short_ids else "fold", no_wrap=short_ids)
        table.add_column("STATUS", no_wrap=True)
        table.add_column("PRI", justify="right")
        table.add_column("ATTEMPTS", justify="right", no_wrap=True)
        table.add_column("CREATED", no_wrap=True)
        table.add_column("NOTE", overflow="ellipsis" if short_ids else "fold", no_wrap=short_ids)
    tasks = list(tasks)
    chars = short_id_chars(task.task_id for task in tasks) if short_ids else 36
    for task in tasks:
        table.add_row(
            literal(short_id(task.task_id, chars)),
            _name(task),
            status_text(task.status),
            str(task.priority),
            f"{task.attempt_count}/{task.max_attempts}",
            when(task.created_at),
            literal(_note(task)),
        )
    return table


def hosts_table(hosts: Sequence[HostView], *, compact: bool = False) -> Table:
    """The `hosts` table: one row per device, grouped by host (`compact`: as for `tasks_table`)."""
    if compact:
        table = _compact_table(None)
        table.add_column("HOST", overflow="fold")
        table.add_column("ONLINE", no_wrap=True)
        table.add_column("LAST SEEN", justify="right")
        table.add_column("DEVICE", overflow="fold")
        table.add_column("STATE", no_wrap=True)
        table.add_column("LABELS", overflow="fold")
    else:
        table = Table(expand=False)
        table.add_column("HOST", no_wrap=True)
        table.add_column("ONLINE", no_wrap=True)
        table.add_column("LAST SEEN", justify="right", no_wrap=True)
        table.add_column("DEVICE", no_wrap=True)
        table.add_column("STATE", no_wrap=True)
        table.add_column("LABELS", overflow="fold")
    for host in sorted(hosts, key=lambda h: h.host_id):
        online = Text("yes", style="green") if host.online else Text("no", style="red")
        if host.logs_closed_until is not None:  # its output rate was over its share: `hosts --json` says until when
            online.append(" (logs closed)", style="yellow")
        devices = host.devices or []
        if not devices:
            table.add_row(literal(host.host_id), online, ago(host.last_seen_at), "-", "", "")
        for i, device in enumerate(sorted(devices, key=lambda d: d.device_id)):
            text = ",".join(f"{k}={v}" for k, v in sorted(device.labels.items()))
            if device.operator_labels:  # the keys an operator pinned (`devsched devices label`)
                text += f" (pinned: {','.join(sorted(device.operator_labels))})"
            labels = literal(text)
            state = Text(str(device.state), style=DEVICE_STYLE.get(DeviceState(device.state), ""))
            if device.quarantined and device.quarantine_reason:
                state.append(visible(f" ({device.quarantine_reason})"))  # why, and since: `hosts --json`
            first = i == 0
            table.add_row(
                literal(host.host_id) if first else "",
                online if first else "",
                ago(host.last_seen_at) if first else "",
                literal(device.device_id),
                state,
                labels,
            )
    return table


def _compact_table(title: str | None) -> Table:
    return Table(
        title=title, title_justify="left", expand=False, box=box.SIMPLE_HEAD, show_edge=False, padding=(0, 1, 0, 0)
    )


class Fitted:
    """A table in its full layout where that fits the width it is given, else in its compact layout.

    Args:
        build: Makes the table; its argument is `compact`.
    """

    def __init__(self, build: Callable[[bool], Table]) -> None:
        self.build = build

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        """The full table if its natural width fits `options.max_width`, the compact one otherwise."""
        full = self.build(False)
        yield full if natural_width(console, full) <= options.max_width else self.build(True)


def natural_width(console: Console, table: Table) -> int:
    """The width `table` takes when nothing limits it (a measurement is clamped to the width it is given)."""
    return Measurement.get(console, console.options.update_width(10_000), table).maximum


def print_table(console: Console, build: Callable[[bool], Table]) -> None:
    """Print a table so that no column is lost: fitted to a terminal, as plain columns into a pipe.

    Rich renders into a pipe at 80 columns, where it would wrap every row or squeeze whole columns out; a
    script reading `devsched ls | grep queued` wants one line per row with every value whole, so a pipe gets
    the full table without its rules, at the width it needs (still text for people: `--json` and `ls -q` are
    the machine formats).
    """
    if console.is_terminal:
        console.print(Fitted(build))
        return
    full = build(False)
    full.box = None  # plain columns: no rules to strip before `cut`, `awk` or `grep`
    full.show_edge = False
    full.pad_edge = False
    Console(
        file=console.file,
        width=natural_width(console, full),
        highlight=False,
        markup=False,
        emoji=False,
        color_system=None,
    ).print(full)


def task_detail(view: TaskView) -> RenderableType:
    """The `get` view: the task's fields, its attempts, and the reported step results."""
    head = Table.grid(padding=(0, 2))
    head.add_column(style="bold")
    head.add_column()
    head.add_row("task", literal(view.task_id))
    head.add_row("name", literal(view.name or "-"))
    head.add_row("status", status_text(view.status))
    if (original := resubmit_of(view.metadata)) is not None:
        head.add_row("resubmit of", literal(original))
    if view.reason:
        head.add_row("reason", literal(view.reason))
    if view.pending_reason:
        head.add_row("waiting", literal(view.pending_reason))
    if view.cancel_requested:
        head.add_row("cancel", "requested")
    parts_of_selector = [f"{k}={v}" for k, v in sorted(view.selector.labels.items())]
    if view.selector.device_id:
        parts_of_selector.append(f"device={view.selector.device_id}")
    selector = ",".join(parts_of_selector) or "any device"
    head.add_row("selector", literal(selector))
    head.add_row("priority", str(view.priority))
    released = f", {view.releases} released (not counted)" if view.releases else ""
    head.add_row("attempts", f"{view.attempt_count}/{view.max_attempts}{released}")
    if view.lease_ttl_s is not None:
        head.add_row("lease ttl", f"{view.lease_ttl_s} s")
    head.add_row("steps", literal(", ".join(f"{s.name} ({s.action})" for s in view.plan.steps)))
    head.add_row("created", when(view.created_at))
    head.add_row("updated", when(view.updated_at))
    parts: list[RenderableType] = [head]
    if view.attempts:
        attempts = Table(title="attempts", title_justify="left")
        for column in ("#", "HOST", "DEVICE", "STATUS", "ASSIGNED", "ENDED", "END REASON", "PROGRESS"):
            attempts.add_column(column, no_wrap=column != "PROGRESS")
        for a in view.attempts:
            progress = f"{a.progress.step} ({a.progress.index + 1}/{a.progress.of})" if a.progress else ""
            attempts.add_row(
                str(a.attempt),
                literal(a.host_id),
                literal(a.device_id),
                literal(a.status),
                when(a.assigned_at),
                when(a.ended_at),
                literal(a.end_reason or ""),
                literal(progress),
            )
        parts.append(attempts)
    if view.result is not None and view.result.steps:
        steps = Table(title="result", title_justify="left")
        for column in ("STEP", "STATUS", "EXIT", "OUTPUT (tail)"):
            steps.add_column(column, overflow="fold")
        for s in view.result.steps:
            tail = (s.output_tail or "").strip().split("\n")  # a CR stays in its line, shown as `\r`
            steps.add_row(
                literal(s.name),
                literal(s.status),
                "" if s.exit_code is None else str(s.exit_code),
                literal("\n".join(tail[-3:]), lines=True),
            )
        parts.append(steps)
    results = step_results(view)
    if results is not None:
        parts.append(results)
    return Group(*parts)


#: Longest failure message shown in a terminal (its first line), in characters.
_SHOWN_MESSAGE_CHARS = 160


def results_counts(summary: ResultsSummary) -> str:
    """A results summary in one line: `junit: 12 tests, 2 failures, 0 errors, 1 skipped`, or why it is missing.

    Control characters are visible escapes (`visible`): the line is the host's words.
    """
    if summary.error is not None:
        return visible(f"{summary.format}: not read: {summary.error}")
    return visible(
        f"{summary.format}: {summary.tests} tests, {summary.failures} failures, "
        f"{summary.errors} errors, {summary.skipped} skipped"
    )


def failing_tests(summary: ResultsSummary) -> list[str]:
    """The failing tests a summary names, one line each (`✗ classname.name: message`), and how many it does not.

    Control characters are visible escapes (`visible`).
    """
    lines = []
    for failed in summary.failed:
        line = f"{failed.classname}.{failed.name}" if failed.classname else failed.name
        first = (failed.message or "").strip().splitlines()
        if first:
            message = first[0]
            cut = message[:_SHOWN_MESSAGE_CHARS] + ("…" if len(message) > _SHOWN_MESSAGE_CHARS else "")
            line += f": {cut}"
        lines.append(visible(f"✗ {line}"))
    unnamed = summary.failures + summary.errors - len(summary.failed)
    if unnamed > 0 and summary.failed:
        lines.append(f"… and {unnamed} more failing")
    return lines


def results_lines(view: TaskView) -> list[Text]:
    """Each step's test results, as lines for a terminal (what `watch` prints when the task ends)."""
    lines = []
    for step in view.result.steps if view.result is not None else []:
        if step.results is None:
            continue
        line = literal(f"step {step.name!r} ")
        line.append(results_counts(step.results), style=_results_style(step.results))
        lines.append(line)
        lines.extend(Text(f"  {failing}", style="red") for failing in failing_tests(step.results))
    return lines


def step_results(view: TaskView) -> RenderableType | None:
    """The `get` view's test results: per step that declared `results`, its counts and first failing tests."""
    steps = [s for s in (view.result.steps if view.result is not None else []) if s.results is not None]
    if not steps:
        return None
    table = Table(title="test results", title_justify="left")
    table.add_column("STEP", overflow="fold")
    table.add_column("RESULTS", overflow="fold")
    for step in steps:
        assert step.results is not None
        cell = Text(results_counts(step.results), style=_results_style(step.results))
        for failing in failing_tests(step.results):
            cell.append(f"\n{failing}", style="red")
        table.add_row(literal(step.name), cell)
    return table


def _results_style(summary: ResultsSummary) -> str:
    if summary.error is not None:
        return "yellow"
    return "red" if summary.failures or summary.errors else "green"


def checks_table(checks: Iterable[HealthCheckView]) -> Table:
    """The `health ls` table: one row per check."""
    table = Table(box=None, pad_edge=False)
    for column in ("NAME", "SELECTOR", "INTERVAL", "STEPS", "UPDATED"):
        table.add_column(column)
    for c in checks:
        labels = ",".join(f"{k}={v}" for k, v in sorted(c.selector.labels.items())) or "*"
        steps = ",".join(s.name for s in c.plan.steps)
        updated = c.updated_at.isoformat(timespec="seconds")
        table.add_row(literal(c.name), literal(labels), f"{c.interval_s:g} s", literal(steps), updated)
    return table


def size(n: int) -> str:
    """A size in bytes for people: `512 B`, `3.2 MiB`."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def artifacts_table(artifacts: Iterable[ArtifactView]) -> Table:
    """The `artifacts` table: one row per stored file."""
    table = Table(box=None, pad_edge=False)
    for column in ("ATTEMPT", "NAME", "SIZE", "SHA256", "STEP"):
        table.add_column(column)
    for a in artifacts:
        table.add_row(str(a.attempt), literal(a.name), size(a.size), literal(a.sha256), literal(a.step))
    return table


def event_line(event: TaskEvent) -> Text:
    """One event as a line: time, kind, status and what it concerns."""
    line = Text()
    line.append(when(event.at), style="dim")
    line.append(f"  #{event.seq:<3} ")
    line.append(f"{event.event!s:<17}", style="bold")
    line.append_text(status_text(event.status))
    line.append(" " * max(0, 10 - len(str(event.status))))
    details = []
    if event.attempt is not None:
        details.append(f"attempt {event.attempt}")
    if event.host_id or event.device_id:
        details.append(f"on {event.host_id or '?'}/{event.device_id or '?'}")
    if event.progress is not None:
        details.append(f"step {event.progress.index + 1}/{event.progress.of} {event.progress.step!r}")
    if event.reason:
        details.append(f"({event.reason})")
    if details:
        line.append(visible("  " + " ".join(details)))
    return line
