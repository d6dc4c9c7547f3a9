"""`devsched health`: the operators' health checks (issue 13).

    devsched health set NAME PLAN_FILE [--selector k=v ...] [--interval S]   create or replace a check
    devsched health ls [--json]                                              the checks in force
    devsched health rm NAME                                                  remove one

A check's plan runs as a `health` task on each device whose labels contain its selector's: on a
quarantined device (passing returns it to service), before a device's first task, and every interval.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from devsched.client.cli.common import check, out, print_json, run, with_client
from devsched.client.cli.render import checks_table, literal
from devsched.client.client import Client
from devsched.client.plans import load_document, parse_labels

app = typer.Typer(help="Health checks: plans run on devices to keep them in, or return them to, service.")

JsonFlag = Annotated[bool, typer.Option("--json", help="Print one JSON document instead of a table.")]


def _plan_of(path: Path) -> dict[str, Any]:
    """The plan in a plan file: a plan (`{steps: [...]}`), or a submit request's `plan`."""
    document = load_document(path)
    plan = document.get("plan")
    return dict(plan) if "steps" not in document and isinstance(plan, dict) else document


@app.command("set")
def set_check(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="The check's name (letters, digits, _ and -).")],
    plan_file: Annotated[Path, typer.Argument(help="Plan file, YAML or JSON ({steps: [...]}).")],
    selector: Annotated[
        list[str] | None,
        typer.Option("--selector", "-s", metavar="KEY=VALUE", help="Device label the check applies to; repeatable."),
    ] = None,
    interval: Annotated[
        float | None, typer.Option("--interval", help="Seconds between two runs on a device [default: 86400].")
    ] = None,
    json_out: JsonFlag = False,
) -> None:
    """Create or replace the health check NAME."""
    plan = check(lambda: _plan_of(plan_file))
    labels = check(lambda: parse_labels(selector or []))

    async def main(client: Client) -> None:
        view = await client.health_set(name, plan, labels=labels, interval_s=interval)
        if json_out:
            print_json(view)
            return
        where = ",".join(f"{k}={v}" for k, v in sorted(view.selector.labels.items())) or "every device"
        out.print(literal(f"health check {view.name} set: {where}, every {view.interval_s:g} s"))

    run(lambda: with_client(ctx, main))


@app.command("ls")
def list_checks(ctx: typer.Context, json_out: JsonFlag = False) -> None:
    """List the health checks in force."""

    async def main(client: Client) -> None:
        checks = await client.health_checks()
        if json_out:
            print_json({"checks": [c.model_dump(mode="json") for c in checks]})
            return
        if not checks:
            out.print("no health checks")
            return
        out.print(checks_table(checks))

    run(lambda: with_client(ctx, main))


@app.command("rm")
def remove_check(
    ctx: typer.Context, name: Annotated[str, typer.Argument(help="The check's name.")], json_out: JsonFlag = False
) -> None:
    """Remove the health check NAME (health tasks already open run to their end)."""

    async def main(client: Client) -> None:
        view = await client.health_delete(name)
        if json_out:
            print_json(view)
        else:
            out.print(literal(f"health check {view.name} removed"))

    run(lambda: with_client(ctx, main))
