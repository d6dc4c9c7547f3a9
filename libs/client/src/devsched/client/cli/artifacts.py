"""`devsched artifacts`: the files a task's steps left in `DEVSCHED_ARTIFACTS_DIR` (issue 12).

    devsched artifacts TASK_ID [--attempt N] [--json]            list: attempt, name, size, sha256, step
    devsched artifacts get TASK_ID NAME [--attempt N] [-o PATH]  download (checked against its sha256)

`get` writes `-o PATH` atomically (a temporary file renamed once checked), refuses to replace an existing
file without `--force`, writes to stdout with `-o -`, and to `./<basename of NAME>` without `-o`.
"""

from __future__ import annotations

import sys
from pathlib import Path, PurePosixPath
from typing import Annotated

import typer

from devsched.client.cli.common import ExitCode, check, fail, out, print_json, run, with_client
from devsched.client.cli.render import artifacts_table, literal, visible
from devsched.client.client import Client
from devsched.client.task_ids import task_ref


def artifacts(
    ctx: typer.Context,
    args: Annotated[
        list[str],
        typer.Argument(
            help="TASK_ID to list, or: get TASK_ID NAME (TASK_ID: the id or its first 8 or more hex digits).",
            metavar="[get] TASK_ID [NAME]",
        ),
    ],
    attempt: Annotated[
        int | None, typer.Option("--attempt", min=1, help="Only this attempt's [default: all; get: the newest].")
    ] = None,
    output: Annotated[
        str | None, typer.Option("--output", "-o", help="get: where to write it (`-` for stdout).")
    ] = None,
    force: Annotated[bool, typer.Option("--force", help="get: replace an existing file.")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="List as JSON.")] = False,
) -> None:
    """List a task's artifacts (name, size, sha256, step), or download one with `get TASK_ID NAME`."""
    if args and args[0] == "get":
        if len(args) != 3:
            fail("usage: devsched artifacts get TASK_ID NAME [--attempt N] [-o PATH] [--force]", ExitCode.USAGE)
        _get(ctx, args[1], args[2], attempt, output, force)
        return
    if len(args) != 1:
        fail("usage: devsched artifacts TASK_ID [--attempt N] [--json]", ExitCode.USAGE)
    ref = check(lambda: task_ref(args[0]))

    async def main(client: Client) -> None:
        tid = await client.resolve(ref)
        listing = await client.artifacts(tid, attempt=attempt)
        if json_out:
            print_json(listing)
            return
        out.print(artifacts_table(listing.artifacts) if listing.artifacts else literal(f"task {tid} has no artifacts"))

    run(lambda: with_client(ctx, main))


def _get(ctx: typer.Context, task_id: str, name: str, attempt: int | None, output: str | None, force: bool) -> None:
    ref = check(lambda: task_ref(task_id))

    async def main(client: Client) -> None:
        tid = await client.resolve(ref)
        if output == "-":
            data = await client.artifact_bytes(tid, name, attempt=attempt)
            sys.stdout.buffer.write(data)
            sys.stdout.buffer.flush()
            return
        path = Path(output) if output else Path(PurePosixPath(name).name)
        try:
            written = await client.download_artifact(tid, name, path, attempt=attempt, force=force)
        except FileExistsError as exc:
            fail(str(exc), ExitCode.CONFLICT)
        print(visible(str(written)), file=sys.stderr)

    run(lambda: with_client(ctx, main))
