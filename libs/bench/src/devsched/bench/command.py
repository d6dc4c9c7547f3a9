"""The `devsched bench` command: its options, handed to `devsched.bench.runner`."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Annotated

import typer

from devsched.bench.options import FULL, PHASES, QUICK, BenchOptions


def _parse_list(value: str, what: str) -> list[str]:
    items = [part.strip() for part in value.split(",") if part.strip()]
    if not items:
        raise typer.BadParameter(f"give at least one {what}")
    return items


def bench(
    json_path: Annotated[
        Path | None, typer.Option("--json", help="Write every figure and detail as JSON here.")
    ] = None,
    plot_path: Annotated[
        Path | None,
        typer.Option("--plot", help="Draw throughput and CPU against concurrency, and latency distributions (PNG)."),
    ] = None,
    quick: Annotated[
        bool, typer.Option("--quick", help="A smoke run: small sizes and short settles (about a minute).")
    ] = False,
    only: Annotated[
        str, typer.Option("--only", help=f"Comma-separated phases to run, of: {','.join(PHASES)}.")
    ] = ",".join(PHASES),
    concurrency: Annotated[
        str, typer.Option("-c", "--concurrency", help="Comma-separated agent devices / worker concurrency.")
    ] = "1,4,16",
    tasks: Annotated[
        int | None,
        typer.Option("-n", "--tasks", min=1, help=f"Tasks per lifecycle run [{FULL.tasks}; quick {QUICK.tasks}]."),
    ] = None,
    rounds: Annotated[
        int | None,
        typer.Option(
            "--rounds",
            min=1,
            max=9,
            help=f"Lifecycle rounds at each c, devsched and the peer in turn, and renewal rounds, devsched and "
            f"the floor in turn; figures are medians [{FULL.rounds}; quick {QUICK.rounds}].",
        ),
    ] = None,
    profile: Annotated[
        Path | None,
        typer.Option(
            "--profile",
            help="Profile into this directory: py-spy of the scheduler and the agent during the lifecycle at the "
            "highest c, of the scheduler during the renewals, and the SQL of each load (summary.md).",
        ),
    ] = None,
    data_dir: Annotated[
        Path | None,
        typer.Option(help="Where the servers keep their data (on disk); a fresh directory under /var/tmp by default."),
    ] = None,
    keep_data: Annotated[bool, typer.Option(help="Keep the data directory and the services' logs.")] = False,
    nats_sync_always: Annotated[
        bool,
        typer.Option(
            "--nats-sync-always/--nats-sync-default",
            help="JetStream sync_interval `always` (every write fsync'd) or nats-server's default (2 min).",
        ),
    ] = True,
    peer: Annotated[
        bool, typer.Option("--peer/--no-peer", help="Run Procrastinate beside the lifecycle when it is installed.")
    ] = True,
) -> None:
    """Run the end-to-end benchmark: the real scheduler, sweeper and agents on durable embedded servers.

    Each figure is printed beside its floor (bare NATS echo, one-row UPDATE, an UPDATE-per-request renewal
    responder) or its peer (Procrastinate at the same concurrency, with the optional `bench` dependency
    group), measured in the same run, with the goal it is held to. A full run takes about 11 to 15 minutes.
    The pytest micro-benchmarks of a source checkout are separate: `./dev test -m bench tests/bench`.
    """
    from devsched.bench.runner import run_bench  # `--help` does not need it

    phases = _parse_list(only, "phase")
    unknown = sorted(set(phases) - set(PHASES))
    if unknown:
        raise typer.BadParameter(f"unknown phase(s) {', '.join(unknown)}; choose from {', '.join(PHASES)}")
    try:
        levels = tuple(sorted({int(c) for c in _parse_list(concurrency, "concurrency")}))
    except ValueError:
        raise typer.BadParameter(f"concurrency must be whole numbers, not {concurrency!r}") from None
    if any(c < 1 or c > 256 for c in levels):
        raise typer.BadParameter("each concurrency must be 1 to 256")
    sizes = QUICK if quick else FULL
    if tasks is not None:
        sizes = replace(sizes, tasks=tasks)
    if rounds is not None:
        sizes = replace(sizes, rounds=rounds)
    options = BenchOptions(
        sizes=sizes,
        quick=quick,
        concurrency=levels,
        only=tuple(p for p in PHASES if p in phases),
        json_path=json_path,
        plot_path=plot_path,
        profile_dir=profile,
        data_dir=data_dir,
        keep_data=keep_data,
        nats_sync_always=nats_sync_always,
        peer=peer,
    )
    raise typer.Exit(run_bench(options))


def register(app: typer.Typer) -> None:
    """Add `bench` to the `devsched` app (this package's `devsched.cli_plugins` entry point)."""
    app.command()(bench)
