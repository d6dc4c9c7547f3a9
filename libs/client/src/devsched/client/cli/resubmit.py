"""`devsched resubmit`: a new task with an earlier task's plan, selector and options."""

from __future__ import annotations

from typing import Annotated

import typer

from devsched.client.cli.common import check, out, print_json, run, with_client
from devsched.client.client import Client
from devsched.client.task_ids import task_ref

JsonFlag = Annotated[bool, typer.Option("--json", help="Print the submit reply as one JSON document.")]


def resubmit(
    ctx: typer.Context,
    task_id: Annotated[str, typer.Argument(help="The task's id, or its first 8 or more hex digits.")],
    json_out: JsonFlag = False,
) -> None:
    """Submit a new task with this task's plan, selector and options; print the new task's id.

    Everything the task was submitted with is repeated (name, priority, attempts, lease, retry policy,
    timeouts, metadata) except its idempotency key, and its deadline once that has passed.
    """
    ref = check(lambda: task_ref(task_id))

    async def main(client: Client) -> None:
        original = await client.resolve(ref)
        reply = await client.resubmit(original)
        if json_out:
            print_json(reply)
        else:
            out.print(f"submitted {reply.task_id} ({reply.status}), a resubmit of {original}")

    run(lambda: with_client(ctx, main))
