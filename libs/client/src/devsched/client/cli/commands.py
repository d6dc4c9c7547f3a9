"""The task and host commands: submit, get, ls, cancel, watch, hosts, drain (and `logs` in `logs.py`)."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.text import Text

from devsched.client.cli import render
from devsched.client.cli.common import (
    ExitCode,
    check,
    err,
    exit_code_of_status,
    fail,
    out,
    print_json,
    print_json_line,
    run,
    with_client,
)
from devsched.client.cli.logs import print_output_lines
from devsched.client.cli.render import (
    event_line,
    hosts_table,
    literal,
    print_table,
    status_text,
    task_detail,
    tasks_table,
    visible,
)
from devsched.client.client import Client, task_uuid
from devsched.client.plans import load_request, parse_labels
from devsched.client.task_ids import task_ref
from devsched.core.limits import LIST_LIMIT_MAX
from devsched.core.status import TERMINAL, TaskKind, TaskStatus
from devsched.protocol.messages import SubmitRequest, TaskSummary, TaskView

#: Seconds `watch --logs` waits, after the task's last event, for the rest of its output.
OUTPUT_GRACE_S = 10.0

JsonFlag = Annotated[bool, typer.Option("--json", help="Print one JSON document instead of a table.")]


def _summary(view: TaskView) -> Text:
    line = Text(f"task {view.task_id} ")
    line.append_text(status_text(view.status))
    line.append(f" {(view.updated_at - view.created_at).total_seconds():.1f} s after submit")
    if view.reason:
        line.append(visible(f": {view.reason}"))
    return line


async def follow(client: Client, task_id: Any, *, json_lines: bool, quiet: bool, output: bool = False) -> TaskView:
    """Print the task's events as they come (unless `quiet`) and return its final view.

    With `output`, the steps' output lines are printed too, as they come (`devsched watch --logs`).
    """
    tid = task_uuid(task_id)
    started = time.monotonic()
    status = err.status("waiting for events...", spinner="dots") if not (quiet or json_lines or output) else None
    printing = (
        asyncio.create_task(print_output_lines(client.logs(tid, follow=True), json_lines=json_lines))
        if output
        else None
    )
    try:
        if status is not None:
            status.start()
        async with client.watch(tid) as events:
            async for event in events:
                if json_lines:
                    print_json_line(event)
                elif not quiet:
                    out.print(event_line(event))
                if status is not None:
                    step = (
                        f" · step {event.progress.index + 1}/{event.progress.of} {event.progress.step!r}"
                        if (event.progress)
                        else ""
                    )
                    status.update(literal(f"{event.status}{step} · {time.monotonic() - started:.0f} s"))
        if printing is not None:
            with contextlib.suppress(TimeoutError):  # the output ends with the task: bounded, in case it did not
                await asyncio.wait_for(asyncio.shield(printing), OUTPUT_GRACE_S)
    finally:
        if status is not None:
            status.stop()
        if printing is not None and not printing.done():
            printing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await printing
    view = await client.get(tid)
    while view.status not in TERMINAL:  # the stream went quiet before the row changed: ask again
        await asyncio.sleep(0.2)
        view = await client.get(tid)
    if not quiet and not json_lines:
        out.print(_summary(view))
        for line in render.results_lines(view):
            out.print(line)
    return view


def submit(
    ctx: typer.Context,
    plan_file: Annotated[
        Path,
        typer.Argument(
            help="Plan file, YAML or JSON: a plan ({steps: [...]}) or a whole "
            "submit request ({plan: ..., selector: ...})."
        ),
    ],
    selector: Annotated[
        list[str] | None,
        typer.Option(
            "--selector",
            "-s",
            metavar="KEY=VALUE",
            help="Device label key=value the device must have; repeatable, merged over the file's.",
        ),
    ] = None,
    device: Annotated[str | None, typer.Option("--device", help="Run only on this device id.")] = None,
    priority: Annotated[int | None, typer.Option(help="-1000..1000, higher runs first [default: 0].")] = None,
    max_attempts: Annotated[int | None, typer.Option(help="Leases the task may use, 1..100 [default: 3].")] = None,
    lease_ttl: Annotated[
        int | None, typer.Option("--lease-ttl", help="Lease length in seconds, 1..3600 [default: 30].")
    ] = None,
    idempotency_key: Annotated[
        str | None, typer.Option(help="Submitting the same key again returns the existing task.")
    ] = None,
    name: Annotated[str | None, typer.Option(help="A name for people.")] = None,
    retry_on: Annotated[
        list[str] | None,
        typer.Option(
            "--retry-on",
            metavar="CAUSE",
            help="Retry the task after this kind of failure (infra, lease_expired, released, step_failed, "
            "attempt_timeout), with backoff and preferably on another device; repeatable.",
        ),
    ] = None,
    queue_timeout: Annotated[
        float | None,
        typer.Option("--queue-timeout", help="Fail (queue_timeout) when no device took it within this many seconds."),
    ] = None,
    attempt_timeout: Annotated[
        float | None,
        typer.Option(
            "--attempt-timeout", help="Stop an attempt running this many seconds; it fails (attempt_timeout)."
        ),
    ] = None,
    deadline: Annotated[
        str | None,
        typer.Option(
            "--deadline",
            help="Fail (deadline_exceeded) if not ended by then: an RFC 3339 time, or +SECONDS from now.",
        ),
    ] = None,
    wait: Annotated[
        bool,
        typer.Option(
            "--wait",
            "-w",
            help="Follow the task to its end; the exit code tells how it ended (0 done, 1 failed, 3 cancelled).",
        ),
    ] = False,
    wait_timeout: Annotated[
        float | None, typer.Option(help="With --wait: give up after this many seconds (exit 7; the task goes on).")
    ] = None,
    json_out: JsonFlag = False,
) -> None:
    """Submit a task from a plan file; print its id (or follow it with --wait)."""

    # Validate locally before connecting: a bad file fails fast with the server's own paths.
    def build() -> SubmitRequest:
        return load_request(
            plan_file,
            name=name,
            selector=parse_labels(selector or []) or None,
            device_id=device,
            priority=priority,
            max_attempts=max_attempts,
            lease_ttl_s=lease_ttl,
            idempotency_key=idempotency_key,
            retry_on=retry_on,
            queue_timeout_s=queue_timeout,
            attempt_timeout_s=attempt_timeout,
            deadline=deadline,
        )

    request = check(build)

    async def main(client: Client) -> ExitCode:
        reply = await client.submit(request)
        if not wait:
            if json_out:
                print_json(reply)
            elif reply.created:
                out.print(f"submitted {reply.task_id} ({reply.status})")
            else:
                out.print(f"existing task {reply.task_id} ({reply.status}) for this idempotency key")
            return ExitCode.OK
        if not json_out:
            verb = "submitted" if reply.created else "following existing task"
            out.print(f"{verb} {reply.task_id}; Ctrl-C stops following (the task goes on)")
        try:
            view = await _bounded(follow(client, reply.task_id, json_lines=False, quiet=json_out), wait_timeout)
        except TimeoutError:
            current = await client.get(reply.task_id)
            fail(f"timeout: task {reply.task_id} is still {current.status} after {wait_timeout:g} s", ExitCode.TIMEOUT)
        if json_out:
            print_json(view)
        return exit_code_of_status(view.status)

    code = run(lambda: with_client(ctx, main))
    raise typer.Exit(int(code))


async def _bounded(coro: Coroutine[Any, Any, TaskView], seconds: float | None) -> TaskView:
    async with asyncio.timeout(seconds):
        view: TaskView = await coro
        return view


def get(
    ctx: typer.Context,
    task_id: Annotated[str, typer.Argument(help="The task's id, or its first 8 or more hex digits.")],
    full: Annotated[
        list[str] | None,
        typer.Option(
            "--full",
            help="Show this field whole when the task is too large for one reply (metadata, result, attempts, "
            "artifacts); repeatable.",
        ),
    ] = None,
    json_out: JsonFlag = False,
) -> None:
    """Show a task: status, attempts, and the reported step results."""
    ref = check(lambda: task_ref(task_id))

    async def main(client: Client) -> None:
        view = await client.get(await client.resolve(ref), full=full)
        if json_out:
            print_json(view)
            return
        out.print(task_detail(view))
        if view.truncated:
            cut = ", ".join(view.truncated)
            out.print(f"cut to fit one reply: {cut}; --full FIELD shows a field whole", style="dim")

    run(lambda: with_client(ctx, main))


def ls(
    ctx: typer.Context,
    status: Annotated[TaskStatus | None, typer.Option(help="Only tasks in this status.")] = None,
    limit: Annotated[int, typer.Option(min=1, help="Show at most this many tasks (newest first).")] = 50,
    all_tasks: Annotated[bool, typer.Option("--all", "-a", help="Show every task (all pages).")] = False,
    after: Annotated[
        str | None, typer.Option(help="Start after this cursor (a previous --json output's `next`).")
    ] = None,
    kind: Annotated[
        TaskKind | None, typer.Option(help="Only users' tasks, or only health checks (named health:<check>).")
    ] = None,
    device: Annotated[
        str | None, typer.Option("--device", help="Only tasks that had an attempt on this device (its history).")
    ] = None,
    json_out: JsonFlag = False,
    quiet: Annotated[
        bool, typer.Option("--quiet", "-q", help="Print only the tasks' whole ids, one per line (for scripts).")
    ] = False,
    wide: Annotated[
        bool,
        typer.Option(
            "--wide", help="Whole ids in a terminal too narrow for the full table (by default: their first 8 digits)."
        ),
    ] = False,
) -> None:
    """List tasks, newest first. `--json` prints {"tasks": [...], "next": <cursor or null>}.

    In a terminal too narrow for the whole table, ids are cut to their first 8 digits, which every command
    takes; into a pipe, the table is plain columns with whole ids.
    """
    if quiet and json_out:
        fail("usage: --quiet and --json are two outputs: choose one", ExitCode.USAGE)

    async def main(client: Client) -> None:
        tasks: list[TaskSummary] = []
        cursor = after
        while True:
            want = LIST_LIMIT_MAX if all_tasks else min(LIST_LIMIT_MAX, limit - len(tasks))
            page = await client.list_page(status=status, limit=want, after=cursor, kind=kind, device_id=device)
            tasks.extend(page.tasks)
            cursor = page.next
            if cursor is None or not page.tasks or (not all_tasks and len(tasks) >= limit):
                break
        if json_out:
            print_json({"tasks": [t.model_dump(mode="json") for t in tasks], "next": cursor})
            return
        if quiet:
            sys.stdout.write("".join(f"{t.task_id}\n" for t in tasks))
            sys.stdout.flush()
            return
        if not tasks:
            where = (f" in status {status}" if status else "") + (f" on {device}" if device else "")
            out.print(literal(f"no tasks{where}"))
            return
        print_table(out, lambda compact: tasks_table(tasks, compact=compact, short_ids=compact and not wide))
        trimmed = sum(1 for t in tasks if t.truncated)
        if trimmed:
            out.print(
                f"{trimmed} of these tasks have large fields cut in the list (metadata, result): devsched get <id>",
                style="dim",
            )
        if cursor is not None:
            given = (("status", status), ("kind", kind), ("device", device))
            filters = "".join(f" --{name} {value}" for name, value in given if value)
            out.print(literal(f"more: devsched ls --after {cursor}{filters}", style="dim"))

    run(lambda: with_client(ctx, main))


def cancel(
    ctx: typer.Context,
    task_id: Annotated[str, typer.Argument(help="The task's id, or its first 8 or more hex digits.")],
    reason: Annotated[str | None, typer.Option(help="Why; carried by the cancel_requested event.")] = None,
    json_out: JsonFlag = False,
) -> None:
    """Cancel a task: at once if queued, else at its host's next step boundary. Harmless to repeat."""
    ref = check(lambda: task_ref(task_id))

    async def main(client: Client) -> None:
        reply = await client.cancel(await client.resolve(ref), reason)
        if json_out:
            print_json(reply)
        elif reply.cancel_requested:
            out.print(
                f"cancellation requested for {reply.task_id} ({reply.status}); its host stops it at the "
                "next step boundary"
            )
        elif reply.status is TaskStatus.CANCELLED:
            out.print(f"task {reply.task_id} is cancelled")
        else:
            out.print(f"task {reply.task_id} already ended {reply.status}: nothing to cancel")

    run(lambda: with_client(ctx, main))


def watch(
    ctx: typer.Context,
    task_id: Annotated[str, typer.Argument(help="The task's id, or its first 8 or more hex digits.")],
    json_out: Annotated[bool, typer.Option("--json", help="Print each event as one JSON line (JSON Lines).")] = False,
    logs: Annotated[
        bool,
        typer.Option("--logs", "-l", help="Show the steps' output lines too (with --json: their log records)."),
    ] = False,
) -> None:
    """Follow a task's events from its start to its end; the exit code tells how it ended."""
    ref = check(lambda: task_ref(task_id))

    async def main(client: Client) -> ExitCode:
        view = await follow(client, await client.resolve(ref), json_lines=json_out, quiet=False, output=logs)
        return exit_code_of_status(view.status)

    raise typer.Exit(int(run(lambda: with_client(ctx, main))))


def hosts(ctx: typer.Context, json_out: JsonFlag = False) -> None:
    """List hosts and their devices (state: available, reserved, offline, drained, quarantined)."""

    async def main(client: Client) -> None:
        found = await client.hosts()
        if json_out:
            print_json({"hosts": [h.model_dump(mode="json") for h in found]})
        elif not found:
            out.print("no hosts registered")
        else:
            print_table(out, lambda compact: hosts_table(found, compact=compact))

    run(lambda: with_client(ctx, main))


def drain(
    ctx: typer.Context,
    device_id: Annotated[str | None, typer.Argument(help="The device's id (or --host).")] = None,
    host: Annotated[
        str | None,
        typer.Option(
            "--host",
            help="Drain every device of this host and tell its agent to finish its running work and exit.",
        ),
    ] = None,
    undo: Annotated[
        bool,
        typer.Option("--undo", help="Put the device (or the host's devices) back in service; also lifts a quarantine."),
    ] = False,
    reason: Annotated[str | None, typer.Option(help="Why, for other operators.")] = None,
    json_out: JsonFlag = False,
) -> None:
    """Take a device out of service (a running attempt finishes; nothing new starts), or back with --undo.

    With --host, every device of the host, and its agent finishes its running work and exits 0 once idle.
    """
    if (device_id is None) == (host is None):
        fail("usage: name a device, or a host with --host (not both)", ExitCode.USAGE)

    async def main(client: Client) -> None:
        if host is not None:
            found = await client.drain_host(host, drained=not undo, reason=reason)
            if json_out:
                print_json(found)
            else:
                what = "drained; its agent finishes its running work and exits" if not undo else "back in service"
                out.print(literal(f"host {found.host_id}: {len(found.devices)} devices {what}"))
            return
        assert device_id is not None
        view = await client.drain(device_id, drained=not undo, reason=reason)
        if json_out:
            print_json(view)
        else:
            what = "drained" if view.drained else "back in service"
            out.print(literal(f"device {view.device_id} on {view.host_id}: {what} (state {view.state})"))

    run(lambda: with_client(ctx, main))
