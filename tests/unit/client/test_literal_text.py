"""Server text in the CLI is printed literally: markup shown as written, control characters as visible escapes.

Each renderer of `devsched hosts`, `ls`, `get`, `watch`, `logs`, `health ls`, `artifacts`, the errors and the
`devsched up` live view gets the same hostile value in every free-text field a host or user controls, and is
rendered by a console that reads markup and emoji codes (rich's defaults): the output must hold the value
as written (controls escaped) and none of the raw control characters.
"""

from __future__ import annotations

import base64
import io
import json
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import typer
from rich.console import Console, RenderableType

from devsched.client.cli import common, logs, render
from devsched.core.status import AttemptStatus, DeviceState, EventKind, TaskStatus
from devsched.protocol import messages as m
from devsched.protocol.artifacts import ArtifactView
from devsched.protocol.health import HealthCheckView, HealthSelector
from devsched.protocol.logs import DataEncoding, LogKind, LogRecord, OutputStream
from devsched.protocol.plans import FailedTest, ResultsSummary

TASK_ID = uuid.UUID("0b6f8d7e-2c1a-4e59-9a7f-3d2b1c0e9f11")
T0 = datetime(2025, 3, 4, 5, 6, 7, tzinfo=UTC)
T1 = T0 + timedelta(seconds=30)
ATTEMPT = m.AttemptView(
    attempt=1,
    lease_id=uuid.UUID(int=2),
    host_id="h1",
    device_id="d1",
    status=AttemptStatus.ACTIVE,
    assigned_at=T0,
    expires_at=T1,
)
SUMMARY_FIELDS: dict[str, Any] = {
    "task_id": TASK_ID,
    "priority": 5,
    "max_attempts": 3,
    "attempt_count": 1,
    "cancel_requested": False,
    "created_at": T0,
    "updated_at": T1,
}

#: What a hostile host or user writes: markup that fails, hides a link, restyles; an emoji code; a screen
#: clear, a carriage return, a bell, a right-to-left override, a one-byte CSI, a backspace.
HOSTILE = "[/x] [link=http://evil]y[/link] [bold red]loud :warning: \x1b[2J\r\x07\u202e\x9b\x08end"
#: How it must show.
SHOWN = r"[/x] [link=http://evil]y[/link] [bold red]loud :warning: \x1b[2J\r\x07\u202e\x9b\x08end"
#: Characters that must never reach the terminal from data.
RAW = ("\x1b", "\r", "\x07", "\u202e", "\x9b", "\x08", "⚠")


def shown(renderable: RenderableType) -> str:
    """What a markup-reading console (rich's defaults) prints for `renderable`, without colour, wide enough."""
    file = io.StringIO()
    Console(file=file, width=2000, color_system=None).print(renderable)
    return file.getvalue()


def assert_literal(text: str, times: int = 1) -> None:
    assert text.count(SHOWN) >= times, text
    found = [c for c in RAW if c in text]
    assert not found, (found, text)


def hostile_summary() -> dict[str, Any]:
    return {
        **SUMMARY_FIELDS,
        "name": HOSTILE,
        "status": TaskStatus.FAILED,
        "reason": HOSTILE,
        "selector": m.Selector(labels={"k": HOSTILE}),
        "plan": m.Plan(steps=[m.Step(name=HOSTILE, action="noop")]),
    }


def hostile_view() -> m.TaskView:
    results = ResultsSummary(
        format="junit",
        tests=2,
        failures=1,
        failed=[FailedTest(name=HOSTILE, classname=HOSTILE, message=HOSTILE)],
    )
    step = m.StepResult(
        name=HOSTILE, status=m.StepStatus.FAILED, exit_code=1, output_tail=f"{HOSTILE}\n{HOSTILE}", results=results
    )
    attempt = ATTEMPT.model_copy(update={"progress": m.Progress(step=HOSTILE, index=0, of=1)})
    return m.TaskView(
        **hostile_summary(),
        pending_reason=HOSTILE,
        attempts=[attempt],
        result=m.RunResult(steps=[step]),
    )


def hostile_hosts() -> list[m.HostView]:
    device = m.DeviceView(
        device_id="d1",
        labels={HOSTILE: HOSTILE},
        state=DeviceState.QUARANTINED,
        quarantined=True,
        quarantine_reason=HOSTILE,
    )
    return [m.HostView(host_id="h1", online=True, last_seen_at=T0, devices=[device])]


def test_visible_escapes_every_control_and_keeps_the_rest() -> None:
    assert render.visible(HOSTILE) == SHOWN
    assert render.visible("\x00\x1f\x7f\x85\u2066\u2028\t\n") == r"\x00\x1f\x7f\x85\u2066\u2028\t\n"
    assert render.visible("a\tb\nc\r", lines=True) == "a\tb\nc\\r"
    assert render.visible("ünïcödé ✓ 表 🙂 C:\\path") == "ünïcödé ✓ 表 🙂 C:\\path"
    assert render.visible("\ud800") == r"\ud800"  # a lone surrogate cannot be encoded for a terminal


def test_literal_is_a_text_whatever_the_console_reads() -> None:
    text = render.literal(HOSTILE, style="red")
    assert text.plain == SHOWN
    assert_literal(shown(text))


@pytest.mark.parametrize("compact", [False, True])
def test_hosts_table(compact: bool) -> None:
    # the labels' key and value, and the quarantine reason
    assert_literal(shown(render.hosts_table(hostile_hosts(), compact=compact)), times=3)


@pytest.mark.parametrize("compact", [False, True])
@pytest.mark.parametrize("short_ids", [False, True])
def test_tasks_table(compact: bool, short_ids: bool) -> None:
    tasks = [m.TaskSummary(**hostile_summary())]
    table = shown(render.tasks_table(tasks, compact=compact, short_ids=short_ids and not compact))
    if short_ids and not compact:  # the live view's table cuts long cells with an ellipsis
        assert r"[/x] [link=http://evil]y[/link]" in table
        assert r"\x1b" in table
        assert not [c for c in RAW if c in table], table
    else:
        assert_literal(table, times=2)  # name and note


def test_ls_and_hosts_into_a_pipe() -> None:
    """`print_table` into a pipe prints through a console of its own: that one must not read markup either."""
    tasks = [m.TaskSummary(**hostile_summary())]
    file = io.StringIO()
    render.print_table(Console(file=file), lambda compact: render.tasks_table(tasks, compact=compact))
    render.print_table(Console(file=file), lambda compact: render.hosts_table(hostile_hosts(), compact=compact))
    assert_literal(file.getvalue(), times=5)


def test_get_detail() -> None:
    text = shown(render.task_detail(hostile_view()))
    # name, reason, waiting, selector, steps, progress, step name (twice: result, test results), output tail
    # (two lines), failing test (class, name, message)
    assert_literal(text, times=10)


def test_watch_lines() -> None:
    event = m.TaskEvent(
        event=EventKind.PROGRESS,
        task_id=TASK_ID,
        seq=3,
        attempt=1,
        status=TaskStatus.DISPATCHED,
        at=T1,
        host_id="h1",
        device_id="d1",
        reason=HOSTILE,
        progress=m.Progress(step=HOSTILE, index=0, of=1),
    )
    assert_literal(shown(render.event_line(event)))
    for line in render.results_lines(hostile_view()):
        assert not [c for c in RAW if c in shown(line)]
    errored = ResultsSummary(format="junit", error=HOSTILE)
    assert_literal(render.results_counts(errored))


def test_watch_logs_output_lines() -> None:
    text = shown(logs.output_line(HOSTILE, OutputStream.STDERR, HOSTILE))
    assert_literal(text, times=2)
    splitter = logs.LineSplitter()
    record = output_record(f"{HOSTILE}\n".encode() + b"\x9b raw\n")
    lines = [shown(logs.output_line(r.step, r.stream, t)) for r, t in splitter.feed(record)]
    assert_literal(lines[0])
    assert r"\x9b raw" in lines[1]  # a byte that is not UTF-8: visible too


def test_health_and_artifacts_tables() -> None:
    check = HealthCheckView(
        name=HOSTILE,
        selector=HealthSelector(labels={"k": HOSTILE}),
        plan=m.Plan(steps=[m.Step(name=HOSTILE, action="noop")]),
        interval_s=60,
        created_at=T0,
        updated_at=T1,
    )
    assert_literal(shown(render.checks_table([check])), times=3)
    artifact = ArtifactView(
        attempt=1, name=HOSTILE, step=HOSTILE, size=3, sha256=HOSTILE, host_id="h1", stored_at=T1, object="o"
    )
    assert_literal(shown(render.artifacts_table([artifact])), times=3)


def test_up_live_view() -> None:
    from devsched.devstack.dashboard import dashboard

    tasks = [m.TaskSummary(**hostile_summary())]
    text = shown(dashboard(hostile_hosts(), tasks, None, HOSTILE))
    assert not [c for c in RAW if c in text], text
    assert "[/x] [link=http://evil]y[/link]" in text


def test_errors_are_one_line_with_controls_visible(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(typer.Exit):
        common.fail(f"not_found: {HOSTILE}")
    # one line: runs of whitespace (CR and newline too) become one space; the other controls are escaped
    assert capsys.readouterr().err == "error: not_found: " + SHOWN.replace(r"\r", " ") + "\n"


def test_the_cli_consoles_read_no_markup(capsys: pytest.CaptureFixture[str]) -> None:
    """A string that reaches `out` or `err` unwrapped still prints as written (controls aside)."""
    common.out.print("[/x] [link=http://evil]y[/link] :warning:")
    common.err.print("[/x] [link=http://evil]y[/link] :warning:")
    captured = capsys.readouterr()
    assert captured.out == captured.err == "[/x] [link=http://evil]y[/link] :warning:\n"


def test_json_output_escapes_controls(capsys: pytest.CaptureFixture[str]) -> None:
    common.print_json(hostile_hosts()[0])
    common.print_json_line(hostile_hosts()[0])
    out = capsys.readouterr().out
    assert not [c for c in RAW if c in out], out
    assert json.loads(out.split("\n}\n")[0] + "\n}")["devices"][0]["quarantine_reason"] == HOSTILE


def output_record(data: bytes, seq: int = 1) -> LogRecord:
    return LogRecord(
        task_id=uuid.UUID(int=1),
        attempt=1,
        seq=seq,
        kind=LogKind.OUTPUT,
        at=T0,
        offset=0,
        step="s",
        stream=OutputStream.STDOUT,
        encoding=DataEncoding.BASE64,
        data=base64.b64encode(data).decode(),
    )


def chunks() -> Iterator[LogRecord]:
    """A step's output cut inside a UTF-8 character, with a screen clear, a title change, CR, BEL and bad bytes."""
    data = "tést \x1b[2J\x1b]0;pwned\x07 \u202eevil\r\n\tok\n".encode() + b"\x9b\xff"
    cut = data.index("é".encode()) + 1
    yield output_record(data[:cut], 1)
    yield output_record(data[cut:], 2)


def test_logs_on_a_terminal_shows_controls(capsysbinary: pytest.CaptureFixture[bytes]) -> None:
    shown_output = logs.VisibleOutput()
    show = logs._raw_printer(None, shown_output)
    for record in chunks():
        show(record)
    written = capsysbinary.readouterr().out + shown_output.flush()
    assert written.decode() == "tést \\x1b[2J\\x1b]0;pwned\\x07 \\u202eevil\\r\n\tok\n\\x9b\\xff"


def test_logs_on_a_terminal_ends_a_cut_character_with_its_step(capsysbinary: pytest.CaptureFixture[bytes]) -> None:
    show = logs._raw_printer(None, logs.VisibleOutput())
    show(output_record(b"cut \xc3", 1))
    show(LogRecord(task_id=uuid.UUID(int=1), attempt=1, seq=2, kind=LogKind.STEP_END, at=T0, offset=6, step="s"))
    assert capsysbinary.readouterr().out == b"cut \\xc3"


def test_logs_raw_passes_the_bytes(capsysbinary: pytest.CaptureFixture[bytes]) -> None:
    show = logs._raw_printer(None, None)
    records = list(chunks())
    for record in records:
        show(record)
    assert capsysbinary.readouterr().out == b"".join(r.content() for r in records)
