"""One `devsched bench` run: the servers, the services, the phases in order, then the report.

Servers start in the main thread (so that they die with us), then everything else runs in one event loop:
the scheduler and the sweeper as processes, the bench's connections, the idle system's commit rate, and
the phases (options.PHASES order). A phase that fails is reported and the next one runs; a service that
died ends the run. Whatever happens, every process this run started is stopped by pid and its data
directory removed (unless kept).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import shutil
import time
from collections.abc import Callable
from datetime import UTC, datetime

import nats

from devsched.bench import plot
from devsched.bench.conditions import collect
from devsched.bench.context import Context, TaskEvents
from devsched.bench.latency import latency_phase
from devsched.bench.lifecycle import lifecycle_phase
from devsched.bench.memory import memory_phase
from devsched.bench.options import BenchOptions
from devsched.bench.pgstats import PgStats
from devsched.bench.profiling import PY_SPY_FLAGS, python_table, sql_table
from devsched.bench.renewals import Rig, renewals_phase
from devsched.bench.report import Results, render, render_conditions
from devsched.bench.servers import DATABASE, PREFIX, BenchStack
from devsched.bench.sweep import sweep_phase
from devsched.client.client import Client
from devsched.devstack.stack import sigterm_interrupts
from devsched.protocol.subjects import Subjects


def describe(options: BenchOptions) -> dict[str, object]:
    """The options, for the report and the JSON."""
    return {
        "mode": "quick (a smoke run: small sizes, short settles; not a measurement)" if options.quick else "full",
        "sizes": dataclasses.asdict(options.sizes),
        "concurrency": list(options.concurrency),
        "only": list(options.only),
        "profile": options.profile_dir is not None,
    }


def run_bench(options: BenchOptions, say: Callable[[str], None] = print) -> int:
    """Run the bench; prints the report, writes the JSON and the plot; returns the exit code."""
    results = Results(started_at=datetime.now(UTC).isoformat(timespec="seconds"), options=describe(options))
    made = options.data_dir is None
    data_dir = BenchStack.fresh_data_dir() if made else options.data_dir
    assert data_dir is not None
    stack = BenchStack(data_dir, sync_always=options.nats_sync_always, scheduler_env=options.extra)
    started = time.monotonic()
    code = 0
    try:
        with sigterm_interrupts():
            say(f"starting NATS and PostgreSQL (durable) in {data_dir}")
            stack.start_servers()
            asyncio.run(_run(stack, options, results, say))
    except KeyboardInterrupt:
        results.errors.append("interrupted")
        code = 130
    except Exception as exc:
        if os.environ.get("DEVSCHED_DEBUG"):
            raise
        results.errors.append(f"{type(exc).__name__}: {exc}")
    finally:
        with sigterm_interrupts(), contextlib.suppress(KeyboardInterrupt):
            stack.stop()
        if made and not options.keep_data:
            shutil.rmtree(data_dir, ignore_errors=True)
            if stack.postgres.requested_data_dir is not None:  # relocated where its account could reach it
                shutil.rmtree(stack.postgres.data_dir, ignore_errors=True)
    results.duration_s = time.monotonic() - started
    if results.conditions:
        results.conditions["machine"]["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    say(render(results))
    if options.json_path is not None:
        results.write_json(options.json_path)
        say(f"JSON: {options.json_path}")
    if options.plot_path is not None:
        if plot.available():
            plot.draw(options.plot_path, results.details, results.samples, _title(results))
            say(f"plot: {options.plot_path}")
        else:
            say("no plot: matplotlib is not installed (the `bench` dependency group)")
    if results.errors and code == 0:
        code = 1
    return code


def _title(results: Results) -> str:
    c = results.conditions
    if not c:
        return "devsched bench"
    return (
        f"devsched bench {results.started_at} ({results.options['mode'].split(' ')[0]}): {c['machine']['cpus']} CPUs,"
        f" PostgreSQL {c['postgres']['version']} fsync={c['postgres']['settings']['fsync']},"
        f" NATS sync_interval {c['nats']['sync_interval']}"
    )


async def _run(stack: BenchStack, options: BenchOptions, results: Results, say: Callable[[str], None]) -> None:
    stack.start_scheduler()
    stack.start_sweeper()
    nc = await nats.connect(stack.nats_url, name="devsched-bench", max_reconnect_attempts=-1)
    pg = PgStats(stack.admin_dsn())
    await pg.open()
    events = TaskEvents(nc, Subjects(PREFIX))
    await events.start()
    ctx = Context(options, stack, nc, Client(nc, prefix=PREFIX, timeout=30), pg, events, log=say)
    rig: Rig | None = None
    try:
        await ctx.wait_scheduler()
        await _wait_logged(stack, "sweeping")
        results.conditions = await collect(stack, pg, sync_always=options.nats_sync_always)
        say(render_conditions(results.conditions, results.options))
        say(f"the idle system's commits per second ({2 * options.sizes.settle_s:g} s)")
        rate = await pg.measure_idle(DATABASE, options.sizes.settle_s)
        ctx.details["idle_commits_per_s"] = round(rate, 3)
        timings: dict[str, float] = {}
        ctx.details["phase_seconds"] = timings
        for phase in options.only:
            phase_started = time.monotonic()
            try:
                if phase in ("renewals", "sweep") and not stack.lifted:
                    stack.lift_fair_share()
                    await ctx.wait_scheduler()
                if phase in ("renewals", "sweep") and rig is None:
                    rig = Rig()
                    await rig.setup(ctx)
                if phase == "lifecycle":
                    await lifecycle_phase(ctx)
                elif phase == "latency":
                    await latency_phase(ctx)
                elif phase in ("renewals", "sweep"):
                    assert rig is not None
                    await (renewals_phase if phase == "renewals" else sweep_phase)(ctx, rig)
                elif phase == "memory":
                    if rig is not None:
                        await rig.close()
                        rig = None
                    await memory_phase(ctx)
            except Exception as exc:
                if os.environ.get("DEVSCHED_DEBUG"):
                    raise
                results.errors.append(f"{phase}: {type(exc).__name__}: {exc}")
                say(f"{phase} failed: {type(exc).__name__}: {exc}")
                stack.check_running()  # a service that died ends the run
            finally:
                timings[phase] = round(time.monotonic() - phase_started, 1)
        if options.profile_dir is not None:
            _write_profiles(ctx, results)
    finally:
        results.figures, results.details, results.samples = ctx.figures, ctx.details, ctx.samples
        if rig is not None:
            with contextlib.suppress(Exception):
                await rig.close()
        await pg.close()
        with contextlib.suppress(Exception):
            await nc.close()


async def _wait_logged(stack: BenchStack, message: str, timeout: float = 60.0) -> None:  # noqa: ASYNC109
    deadline = time.monotonic() + timeout
    while stack.sweeper is not None and not stack.sweeper.logged(message):
        stack.check_running()
        if time.monotonic() > deadline:
            raise TimeoutError(f"the sweeper did not log {message!r} within {timeout:g} s")
        await asyncio.sleep(0.1)


def _write_profiles(ctx: Context, results: Results) -> None:
    """`<profile dir>/summary.md`: the scheduler's and the agent's Python (py-spy), the SQL (pg_stat_statements).

    Each profile is named for its process first (`scheduler-renewals`, `agent-lifecycle-c16`).
    """
    directory = ctx.profile_dir
    assert directory is not None
    directory.mkdir(parents=True, exist_ok=True)
    parts = [
        "# devsched bench: profiles of the scheduler and the agent",
        "",
        render_conditions(results.conditions, results.options).replace("\n", "  \n"),
    ]
    for name, (per, what, cpu_s) in ctx.spied.items():
        raw, whose = directory / f"{name}.raw", name.split("-", 1)[0]
        parts += [
            "",
            f"## {name}: the {whose}'s Python",
            "",
            f"`py-spy record {' '.join(PY_SPY_FLAGS)} --pid <{whose}> --output {raw.name}` over the measured load",
            "",
            python_table(raw, per=per, what=what, cpu_s=cpu_s),
        ]
    for name, (statements, per, what) in ctx.sql_profiles.items():
        parts += [
            "",
            f"## {name}: SQL",
            "",
            "`SELECT query, calls, total_exec_time, rows FROM pg_stat_statements` over the devsched database,"
            " reset before the load",
            "",
            sql_table(statements, per=per, what=what),
        ]
    (directory / "summary.md").write_text("\n".join(parts) + "\n")
    ctx.say(f"profiles: {directory / 'summary.md'}")
