r"""`devsched logs`: a task's step output, byte for byte; and the output lines `devsched watch --logs` shows.

The output bytes go to stdout exactly as the steps wrote them (stdout and stderr in the order the agent
read them, or one of them with `--stream`); what the agent says about the output (dropped while NATS was
away, cut at the attempt's cap, an attempt that lost its lease, the next attempt starting) goes to stderr
as `devsched: ...` lines, so a redirected stdout holds only the steps' bytes.

On a terminal, the output is shown with its control characters as visible escapes (`\x1b[2J`, `\r`;
`render.visible`, newlines and tabs kept, bytes that are not UTF-8 as `\xNN`): a step's output cannot
clear the screen, retitle the window, plant a hyperlink or overwrite a line. `--raw` passes the bytes to
the terminal unchanged (colours of tools that print them), as they always go into a pipe or a file.
"""

from __future__ import annotations

import codecs
import sys
from collections.abc import Callable
from typing import Annotated

import typer
from rich.text import Text

from devsched.client.cli.common import check, err, out, print_json_line, run, with_client
from devsched.client.cli.render import literal, visible
from devsched.client.client import Client
from devsched.client.errors import DevschedError, describe
from devsched.client.logs import LogReader
from devsched.client.task_ids import task_ref
from devsched.protocol.logs import LogKind, LogRecord, OutputStream

MiB = 1024 * 1024


def _size(n: int) -> str:
    return f"{n / MiB:.1f} MiB" if n >= MiB else f"{n} bytes"


def note_of(record: LogRecord) -> str | None:
    """What a control record tells a person, if anything (one line, no trailing newline)."""
    head = f"attempt {record.attempt}"
    if record.kind is LogKind.DROPPED:
        return (
            f"{head}: {_size(record.dropped_bytes or 0)} of output of step {record.step!r} dropped by the agent "
            "(its buffer was full while NATS was slow or away)"
        )
    if record.kind is LogKind.REFUSED:
        return (
            f"{head}: {record.refused_records or 0} records ({_size(record.dropped_bytes or 0)} of output) refused "
            "by the logs stream: this host's output rate was over its share"
        )
    if record.kind is LogKind.TRUNCATED:
        return f"{head}: output cut at the attempt's cap of {_size(record.cap_bytes or 0)}; the rest is not stored"
    if record.kind is LogKind.END:
        parts = []
        if record.lease_lost:
            parts.append(f"{head} lost its lease: its output is kept up to here")
        cut = (record.output_bytes or 0) - (record.sent_bytes or 0) - (record.dropped_bytes or 0)
        if cut > 0:
            parts.append(f"{head}: {_size(cut)} of output past the cap not stored")
        return "; ".join(parts) or None
    return None


def _note(text: str) -> None:
    sys.stdout.flush()  # keep the order of stdout and stderr on a terminal
    sys.stderr.write(f"devsched: {visible(text)}\n")
    sys.stderr.flush()


class LineSplitter:
    """Output bytes cut into whole lines per step and stream (for `watch --logs`), the rest kept for later."""

    def __init__(self) -> None:
        self._partial: dict[tuple[int, str | None, OutputStream | None], bytes] = {}

    def feed(self, record: LogRecord) -> list[tuple[LogRecord, str]]:
        """The complete lines a record finishes, each with the record it ends in.

        The partial lines of a step that ended, or of an attempt that ended, come out whole.
        """
        if record.kind is LogKind.OUTPUT:
            key = (record.attempt, record.step, record.stream)
            data = self._partial.pop(key, b"") + record.content()
            *lines, rest = data.split(b"\n")
            if rest:
                self._partial[key] = rest
            return [(record, line.decode("utf-8", "backslashreplace")) for line in lines]
        if record.kind in (LogKind.STEP_END, LogKind.END):
            done = [k for k in self._partial if k[0] == record.attempt and record.step in (None, k[1])]
            return [(record, self._partial.pop(k).decode("utf-8", "backslashreplace")) for k in done]
        return []


def output_line(step: str | None, stream: OutputStream | None, text: str) -> Text:
    """One line of a step's output as `watch --logs` shows it: `  │ step │ text` (stderr in yellow).

    Control characters are visible escapes (`visible`), newlines and tabs kept.
    """
    line = Text("  │ ", style="dim")
    line.append(visible(step or "-"), style="bold dim")
    line.append(" │ ", style="dim")
    line.append(visible(text, lines=True), style="yellow" if stream is OutputStream.STDERR else "")
    return line


async def print_output_lines(reader: LogReader, *, json_lines: bool) -> None:
    """Print a followed reader's output as lines (or its records as JSON lines) until it ends.

    The output cannot be read (no logs stream, NATS away): one line on stderr, and the events go on.
    """
    lines = LineSplitter()
    try:
        async with reader:
            async for record in reader:
                if json_lines:
                    print_json_line(record)
                    continue
                note = note_of(record)
                if note is not None:
                    err.print(literal(f"devsched: {note}", style="dim"))
                for source, text in lines.feed(record):
                    out.print(output_line(source.step, source.stream, text))
    except DevschedError as exc:
        err.print(literal(f"devsched: the steps' output cannot be shown: {describe(exc)}", style="dim"))


class VisibleOutput:
    r"""Output bytes as text with visible control characters, decoded per step and stream.

    A UTF-8 character cut between two records is decoded whole; a byte that is not UTF-8 shows as `\xNN`.
    """

    def __init__(self) -> None:
        self._decoders: dict[tuple[int, str | None, OutputStream | None], codecs.IncrementalDecoder] = {}

    def feed(self, record: LogRecord) -> bytes:
        """What to write for an output record's bytes (UTF-8, every control but newline and tab escaped)."""
        key = (record.attempt, record.step, record.stream)
        decoder = self._decoders.get(key)
        if decoder is None:
            decoder = self._decoders[key] = codecs.getincrementaldecoder("utf-8")("backslashreplace")
        return visible(decoder.decode(record.content()), lines=True).encode()

    def flush(self) -> bytes:
        """The escaped rest of every cut character (at the end of a step, of an attempt, of the output)."""
        rest = "".join(d.decode(b"", final=True) for d in self._decoders.values())
        self._decoders.clear()
        return visible(rest, lines=True).encode()


def _raw_printer(stream: OutputStream | None, shown: VisibleOutput | None) -> Callable[[LogRecord], None]:
    """Prints output records' bytes as they are, or through `shown` (visible controls); notes on stderr."""
    attempt: list[int] = []

    def show(record: LogRecord) -> None:
        if attempt and attempt[0] != record.attempt:
            _note(f"attempt {record.attempt} follows")
        attempt[:] = [record.attempt]
        if record.kind is LogKind.OUTPUT:
            if stream is None or record.stream is stream:
                sys.stdout.buffer.write(record.content() if shown is None else shown.feed(record))
                sys.stdout.buffer.flush()
            return
        if shown is not None and record.kind in (LogKind.STEP_END, LogKind.END):
            sys.stdout.buffer.write(shown.flush())  # a character the step's output ended inside of
            sys.stdout.buffer.flush()
        note = note_of(record)
        if note is not None:
            _note(note)

    return show


def logs(
    ctx: typer.Context,
    task_id: Annotated[str, typer.Argument(help="The task's id, or its first 8 or more hex digits.")],
    attempt: Annotated[
        int | None, typer.Option("--attempt", min=1, help="This attempt's output [default: the latest attempt].")
    ] = None,
    step: Annotated[str | None, typer.Option("--step", help="Only this step's output.")] = None,
    stream: Annotated[
        OutputStream | None, typer.Option("--stream", help="Only the steps' stdout, or only their stderr.")
    ] = None,
    follow: Annotated[
        bool,
        typer.Option(
            "--follow", "-f", help="Go on printing while the attempt runs; stop when the task (or --attempt) ends."
        ),
    ] = False,
    json_out: Annotated[
        bool, typer.Option("--json", help="Print each record as one JSON line (JSON Lines), control records too.")
    ] = False,
    raw: Annotated[
        bool,
        typer.Option(
            "--raw",
            help="On a terminal too, write the bytes unchanged (by default a terminal is shown control "
            "characters as visible escapes such as \\x1b; a pipe or file always gets the bytes unchanged).",
        ),
    ] = False,
) -> None:
    """Print a task's step output, byte for byte: stdout and stderr in the order the agent read them.

    On a terminal, control characters are shown as visible escapes (`--raw`: unchanged).
    """
    ref = check(lambda: task_ref(task_id))

    async def main(client: Client) -> None:
        tid = await client.resolve(ref)
        shown = None if raw or json_out or not sys.stdout.isatty() else VisibleOutput()
        show = _raw_printer(stream, shown)
        async with client.logs(tid, attempt=attempt, step=step, follow=follow) as records:
            async for record in records:
                if json_out:
                    if record.kind is not LogKind.OUTPUT or stream is None or record.stream is stream:
                        print_json_line(record)
                else:
                    show(record)
            if shown is not None:
                sys.stdout.buffer.write(shown.flush())
                sys.stdout.buffer.flush()
            if records.current_attempt is None:
                _note(f"task {tid} has no attempt yet: no output")

    run(lambda: with_client(ctx, main))
