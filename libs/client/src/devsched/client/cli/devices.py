"""`devsched devices`: operator acts on one device besides draining it (both audited by the scheduler).

devsched devices forget DEVICE --reason TEXT           free it from its host: the next host to register it owns it
devsched devices label DEVICE KEY=VALUE ... [--unset KEY]   pin labels that win over its host's, or unpin them
"""

from __future__ import annotations

from typing import Annotated

import typer

from devsched.client.cli.common import check, out, print_json, run, with_client
from devsched.client.cli.render import literal
from devsched.client.client import Client
from devsched.client.plans import parse_labels

app = typer.Typer(help="Operator acts on a device: free it from its host, pin its labels.")

JsonFlag = Annotated[bool, typer.Option("--json", help="Print one JSON document instead of a line.")]


@app.command("forget")
def forget(
    ctx: typer.Context,
    device_id: Annotated[str, typer.Argument(help="The device's id.")],
    reason: Annotated[str, typer.Option("--reason", help="Why, kept in the audit record (required).")],
    json_out: JsonFlag = False,
) -> None:
    """Free DEVICE from the host that registered it; refused while it runs an attempt.

    A device id belongs to the host that first registered it: another host's registration of it is
    refused until it is forgotten. Then the next host that registers it owns it.
    """

    async def main(client: Client) -> None:
        freed = await client.forget_device(device_id, reason=reason)
        if json_out:
            print_json(freed)
            return
        out.print(
            literal(
                f"device {freed.device_id} freed from host {freed.host_id} at {freed.freed_at.isoformat()}"
                f" by {freed.actor} (audit record {freed.audit_id}): {freed.reason}"
            )
        )

    run(lambda: with_client(ctx, main))


@app.command("label")
def label(
    ctx: typer.Context,
    device_id: Annotated[str, typer.Argument(help="The device's id.")],
    labels: Annotated[list[str] | None, typer.Argument(metavar="KEY=VALUE...", help="Labels to pin.")] = None,
    unset: Annotated[
        list[str] | None, typer.Option("--unset", metavar="KEY", help="A pinned key to unpin; repeatable.")
    ] = None,
    json_out: JsonFlag = False,
) -> None:
    """Pin labels on DEVICE (they win over its host's), or unpin keys with --unset."""
    pinned = check(lambda: parse_labels(labels or []))

    async def main(client: Client) -> None:
        view = await client.label_device(device_id, pinned, unset=unset or [])
        if json_out:
            print_json(view)
            return
        shown = ",".join(f"{k}={v}" for k, v in sorted(view.labels.items())) or "-"
        pins = ",".join(sorted(view.operator_labels)) or "none"
        out.print(literal(f"device {view.device_id} on {view.host_id}: labels {shown} (pinned: {pins})"))

    run(lambda: with_client(ctx, main))
