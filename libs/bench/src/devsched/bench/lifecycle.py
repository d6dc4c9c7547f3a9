"""The lifecycle figures: N no-op tasks submitted one by one, then run by one real agent with c devices.

For each c the agent (`bench-c<c>`, c devices) starts and registers first with its devices drained, so
that Python's start-up stays out of the figures; the N tasks are submitted over NATS one by one (the
submit rate, with the scheduler's CPU per submit); then the devices are returned to service and the
clock runs until every task's terminal event has arrived (tasks/s, CPU per task over the scheduler,
sweeper, agent, Postgres and nats-server, commits per task). Procrastinate does the same work at the
same c right after, on the same Postgres (peer.py), and then the equal-writes floor (lifecycle_floor.py):
devsched's rows and messages per task, with no product logic.

On a shared machine two identical runs can differ by half: each c is run `rounds` times, devsched and
the peer in turn (a slow minute slows both), a fresh agent (`bench-c<c>-r<round>` after the first) each
time, and each figure is the median of its rounds, with the rounds' values in its note.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import asyncpg  # type: ignore[import-untyped]

from devsched.bench.context import NOOP_PLAN, Context
from devsched.bench.figures import Figure, at_least, at_most, median, rounds_note, value_at_most
from devsched.bench.lifecycle_floor import FLOOR_NAME, SCRIPT, FloorRun, run_floor, widths
from devsched.bench.peer import Peer, PeerRun, version
from devsched.bench.pgstats import Counted, Statement, commits_in
from devsched.bench.profiling import statement_summary
from devsched.bench.servers import DATABASE, FLOOR_DATABASE, PEER_DATABASE


@dataclass
class DevschedRun:
    """One devsched lifecycle run at one concurrency."""

    concurrency: int
    tasks: int
    submit_s: float
    submit_cpu_s: dict[str, float]
    submit_counted: Counted
    submit_statements: list[Statement]
    run_s: float
    run_cpu_s: dict[str, float]
    run_counted: Counted
    run_statements: list[Statement]
    outcomes: dict[str, int]
    stream_messages: int
    """Messages JetStream stored from the first submit to the last task's end (every stream)."""

    @property
    def submits_per_s(self) -> float:
        """Tasks submitted per second, one by one."""
        return self.tasks / self.submit_s

    @property
    def tasks_per_s(self) -> float:
        """Tasks run to their end per second."""
        return self.tasks / self.run_s

    def cpu_ms_per_task(self) -> float:
        """CPU ms per task, every process."""
        return 1000 * sum(self.run_cpu_s.values()) / self.tasks

    def statements_per_task(self) -> float:
        """SQL statements (each a round trip to Postgres, BEGIN and COMMIT included) per task, submit and run."""
        return sum(s.calls for s in (*self.submit_statements, *self.run_statements)) / self.tasks

    def whole(self) -> Counted:
        """What submitting and running the tasks cost the database together."""
        return self.submit_counted.plus(self.run_counted)

    def as_dict(self) -> dict[str, Any]:
        """For the JSON output."""
        n = self.tasks
        return {
            "concurrency": self.concurrency,
            "tasks": n,
            "submit_s": round(self.submit_s, 4),
            "submits_per_s": round(self.submits_per_s, 1),
            "submit_cpu_s": {k: round(v, 4) for k, v in self.submit_cpu_s.items()},
            "submit_commits_per_task": round(self.submit_counted.commits / n, 3),
            "submit_write_transactions_per_task": round(self.submit_counted.write_transactions / n, 3),
            "submit_sql": statement_summary(self.submit_statements, n),
            "run_s": round(self.run_s, 4),
            "tasks_per_s": round(self.tasks_per_s, 1),
            "run_cpu_s": {k: round(v, 4) for k, v in self.run_cpu_s.items()},
            "cpu_ms_per_task": round(self.cpu_ms_per_task(), 4),
            "commits_per_task": round(self.run_counted.commits / n, 3),
            "wal_bytes_per_task": round(self.run_counted.wal_bytes / n),
            "write_transactions_per_task": round(self.run_counted.write_transactions / n, 3),
            "row_versions_per_task": round(self.whole().row_versions / n, 3),
            "stream_messages_per_task": round(self.stream_messages / n, 3),
            "commit_statements_per_task": round(commits_in(self.run_statements) / n, 3),
            "statements_per_task": round(self.statements_per_task(), 3),
            "wal_syncs_per_task": round(self.whole().wal_syncs / n, 3),
            "run_sql": statement_summary(self.run_statements, n),
            "outcomes": self.outcomes,
        }


async def run_devsched(ctx: Context, concurrency: int, tasks: int, *, profile: bool, round_: int = 1) -> DevschedRun:
    """One lifecycle run of `tasks` tasks on a fresh agent with `concurrency` devices (its own host and labels)."""
    stack, client, pg, settle = ctx.stack, ctx.client, ctx.pg, ctx.sizes.settle_s
    name = f"c{concurrency}" if round_ == 1 else f"c{concurrency}-r{round_}"
    host_id, labels = f"bench-{name}", {"bench": f"lifecycle-{name}"}
    agent = stack.start_agent(host_id, concurrency, labels)
    try:
        devices = await ctx.wait_host(host_id, concurrency)
        for device in devices:
            await client.drain(device, reason="bench: held until the tasks are queued")
        await asyncio.sleep(settle)  # the registration's and the drains' counts come in first
        before = await pg.counters(DATABASE)
        messages_before = await ctx.stream_messages()
        await pg.reset_statements()

        meter = ctx.meter("scheduler", "sweeper", "postgres", "nats", f"agent {host_id}")
        meter.start()
        started = time.perf_counter()
        ids = []
        for _ in range(tasks):
            ids.append(str((await client.submit(NOOP_PLAN, selector=labels)).task_id))
        submit_s = time.perf_counter() - started
        submit_cpu = meter.stop()
        submit_statements = await pg.statements(DATABASE)
        submit_counted, mid = await pg.settled(DATABASE, before, settle)

        await pg.reset_statements()
        watch = ctx.events.watch(ids)
        spy = ctx.spy(f"scheduler-lifecycle-c{concurrency}") if profile else None
        agent_spy = ctx.spy(f"agent-lifecycle-c{concurrency}", agent) if profile else None
        meter.start()
        started = time.perf_counter()
        await asyncio.gather(*(client.drain(d, drained=False) for d in devices))
        await watch.wait(60 + tasks * 0.5, f"lifecycle c={concurrency}")
        run_s = time.perf_counter() - started
        run_cpu = meter.stop()
        for spying in (spy, agent_spy):
            if spying is not None:
                ctx.stop_spy(spying)
        ctx.events.forget(watch)
        run_statements = await pg.statements(DATABASE)
        run_counted, _ = await pg.settled(DATABASE, mid, settle)
        stream_messages = await ctx.stream_messages() - messages_before
        outcomes: dict[str, int] = {}
        for event in watch.final.values():
            outcomes[str(event.get("status"))] = outcomes.get(str(event.get("status")), 0) + 1
    finally:
        stack.stop_agent(host_id)
    if round_ == 1:
        ctx.sql_profiles[f"lifecycle c={concurrency}: submit"] = (submit_statements, tasks, "submit")
        ctx.sql_profiles[f"lifecycle c={concurrency}: run"] = (run_statements, tasks, "task")
    if spy is not None:
        ctx.spied[spy.output.stem] = (tasks, "task", run_cpu.get("scheduler", 0.0))
    if agent_spy is not None:
        ctx.spied[agent_spy.output.stem] = (tasks, "task", run_cpu.get(f"agent {host_id}", 0.0))
    return DevschedRun(
        concurrency, tasks, submit_s, submit_cpu, submit_counted, submit_statements,
        run_s, run_cpu, run_counted, run_statements, outcomes, stream_messages,
    )  # fmt: skip


async def lifecycle_phase(ctx: Context) -> None:
    """Devsched and (when installed) Procrastinate at each concurrency, in rounds; adds the lifecycle figures."""
    tasks, rounds = ctx.sizes.tasks, ctx.sizes.rounds
    installed = version()
    peer_version = installed if ctx.options.peer else None
    peer: Peer | None = None
    if peer_version is not None:
        peer = Peer(ctx.stack.admin_dsn(PEER_DATABASE), PEER_DATABASE, ctx.pg, ctx.stack.postgres.pid)
        await peer.prepare()
    peer_name = f"Procrastinate {peer_version}" if peer_version else None
    not_installed = "" if peer_version else "Procrastinate not installed (dependency group `bench`)"
    if installed and not ctx.options.peer:
        not_installed = "peer skipped (--no-peer)"
    runs: list[dict[str, Any]] = []
    ours: dict[int, list[DevschedRun]] = {}
    theirs: dict[int, list[PeerRun]] = {}
    floors: dict[int, list[FloorRun]] = {}
    pids = ctx.stack.pids()
    servers = {name: pids.get(name) for name in ("postgres", "nats")}
    for c in ctx.options.concurrency:
        ctx.say(f"lifecycle c={c}: {tasks} tasks submitted one by one, then one agent with {c} devices")
        for r in range(1, rounds + 1):
            prefix = f"  round {r}/{rounds}, " if rounds > 1 else "  "
            profile = c == max(ctx.options.concurrency) and r == 1
            run = await run_devsched(ctx, c, tasks, profile=profile, round_=r)
            ours.setdefault(r, []).append(run)
            ctx.say(
                f"{prefix}devsched: {run.submits_per_s:.0f} submits/s, {run.tasks_per_s:.1f} tasks/s,"
                f" {run.cpu_ms_per_task():.2f} CPU ms/task, {run.run_counted.commits / tasks:.2f} commits/task"
            )
            peer_run = None
            if peer is not None:
                peer_run = await peer.run(tasks, c)
                theirs.setdefault(r, []).append(peer_run)
                ctx.say(
                    f"{prefix}{peer_name}: {peer_run.defer_rate:.0f} defers/s, {peer_run.jobs_per_s:.1f} jobs/s,"
                    f" {peer_run.cpu_ms_per_job():.2f} CPU ms/job"
                )
            conn = await asyncpg.connect(ctx.stack.admin_dsn(DATABASE))
            try:
                sizes = await widths(conn)
            finally:
                await conn.close()
            floor = await run_floor(ctx.stack.admin_dsn(FLOOR_DATABASE), ctx.stack.nats_url, servers, c, tasks, sizes)
            floors.setdefault(c, []).append(floor)
            ctx.say(f"{prefix}floor: {floor.tasks_per_s:.1f} tasks/s, {floor.cpu_ms_per_task():.2f} CPU ms/task")
            runs.append({
                "round": r, "devsched": run.as_dict(), "peer": None if peer_run is None else peer_run.as_dict(),
                "floor": floor.as_dict(),
            })  # fmt: skip
        at_c = [rs[-1] for rs in ours.values() if rs[-1].concurrency == c]
        peers_at_c = [ps[-1] for ps in theirs.values() if ps[-1].concurrency == c]
        _figures_at(ctx, at_c, peers_at_c, peer_name, not_installed)
        _floor_figures(ctx, at_c, floors[c])
    _submit_figures(ctx, list(ours.values()), list(theirs.values()), peer_name, not_installed)
    ctx.details["lifecycle"] = {"peer": peer_name or not_installed, "rounds": rounds, "runs": runs}


def _figures_at(ctx: Context, runs: list[DevschedRun], peers: list[PeerRun], peer_name: str | None, note: str) -> None:
    """The figures at one c: each the median of its rounds (devsched's and the peer's apart)."""
    c, n = runs[0].concurrency, runs[0].tasks
    goal = {16: at_least(1.0), 1: at_least(0.6)}.get(c)
    # which processes were busy: in the round of the median throughput
    middle = sorted(runs, key=lambda r: r.tasks_per_s)[(len(runs) - 1) // 2]
    busy = ", ".join(
        f"{tree.split(' ')[0]} {seconds / middle.run_s:.0%}" for tree, seconds in middle.run_cpu_s.items() if seconds
    )

    def median_of(
        ours: Callable[[DevschedRun], float], theirs: Callable[[PeerRun], float], *, noted: bool = False
    ) -> tuple[float, float | None, str]:
        values, peer_values = [ours(r) for r in runs], [theirs(p) for p in peers]
        spread = rounds_note(values, peer_values) if noted else ""
        return median(values), median(peer_values) if peers else None, "; ".join(filter(None, [note, spread]))

    rate, peer_rate, rate_note = median_of(lambda r: r.tasks_per_s, lambda p: p.jobs_per_s, noted=True)
    cpu, peer_cpu, cpu_note = median_of(lambda r: r.cpu_ms_per_task(), lambda p: p.cpu_ms_per_job(), noted=True)
    commits, peer_commits, _ = median_of(lambda r: r.run_counted.commits / n, lambda p: p.run_counted.commits / n)
    wal, peer_wal, _ = median_of(lambda r: r.whole().wal_bytes / n, lambda p: p.whole().wal_bytes / n)
    versions, peer_versions, _ = median_of(lambda r: r.whole().row_versions / n, lambda p: p.whole().row_versions / n)
    messages = median([r.stream_messages / n for r in runs])
    syncs, peer_syncs, _ = median_of(lambda r: r.whole().wal_syncs / n, lambda p: p.whole().wal_syncs / n)
    statements = median([r.statements_per_task() for r in runs])
    ctx.figures += [
        Figure(f"lifecycle.c{c}.tasks_per_s", f"tasks/s, c={c}", "tasks/s", rate, peer_rate, peer_name,
               goal, "; ".join(filter(None, [rate_note, f"of one core: {busy}"]))),
        Figure(f"lifecycle.c{c}.cpu_ms_per_task", f"CPU ms/task, c={c} (all processes)", "ms", cpu, peer_cpu,
               peer_name, at_most(1.5), cpu_note),
        Figure(f"lifecycle.c{c}.commits_per_task", f"commits/task, c={c}", "commits", commits, peer_commits,
               peer_name, value_at_most(4.0), note),
        Figure(f"lifecycle.c{c}.wal_bytes_per_task", f"WAL bytes/task, c={c} (submit and run)", "B", wal, peer_wal,
               peer_name, at_most(2.5), note),
        Figure(f"lifecycle.c{c}.row_versions_per_task", f"row versions/task, c={c} (inserts and updates)",
               "versions", versions, peer_versions, peer_name, value_at_most(7.0), note),
        Figure(f"lifecycle.c{c}.stream_messages_per_task", f"JetStream messages/task, c={c}", "messages",
               messages, goal=value_at_most(2.0)),
        Figure(f"lifecycle.c{c}.wal_syncs_per_task", f"WAL fsyncs/task, c={c} (submit and run)", "fsyncs", syncs,
               peer_syncs, peer_name, note="; ".join(filter(None, [note, "the whole cluster's, pg_stat_io"]))),
        Figure(f"lifecycle.c{c}.statements_per_task", f"SQL round trips/task, c={c} (submit and run)", "statements",
               statements, note=f"BEGIN and COMMIT included, pg_stat_statements; the floor's: {len(SCRIPT)}"),
    ]  # fmt: skip


def _floor_figures(ctx: Context, runs: list[DevschedRun], floors: list[FloorRun]) -> None:
    """Devsched beside the equal-writes floor at one c: rate and CPU per task, and where each spends its CPU."""
    c = runs[0].concurrency
    rate, floor_rate = median([r.tasks_per_s for r in runs]), median([f.tasks_per_s for f in floors])
    cpu, floor_cpu = median([r.cpu_ms_per_task() for r in runs]), median([f.cpu_ms_per_task() for f in floors])
    shape = (
        f"the floor: {len(SCRIPT)} one-statement transactions, 12 row versions and"
        f" {sum(len(t.events) for t in SCRIPT)} JetStream messages per task"
    )
    spread = rounds_note([r.tasks_per_s for r in runs], [f.tasks_per_s for f in floors])
    ctx.figures += [
        Figure(f"lifecycle.c{c}.vs_floor_tasks_per_s", f"tasks/s beside the floor, c={c}", "tasks/s", rate,
               floor_rate, FLOOR_NAME, note="; ".join(filter(None, [shape, spread]))),
        Figure(f"lifecycle.c{c}.vs_floor_cpu_ms_per_task", f"CPU ms/task beside the floor, c={c}", "ms", cpu,
               floor_cpu, FLOOR_NAME, note=f"devsched: {_split(runs)}; the floor: {_split(floors)}"),
    ]  # fmt: skip


def _split(runs: list[DevschedRun] | list[FloorRun]) -> str:
    """Each process's CPU ms per task, the median of the rounds: `agent 2.10, scheduler 3.05, ...`.

    By the process's kind (`agent`, not `agent bench-c16-r2`): each round runs an agent of its own.
    """
    per_run = [_by_kind(r.run_cpu_s) for r in runs]
    tasks = [r.tasks for r in runs]
    names = sorted({name for cpu in per_run for name in cpu}, key=lambda n: -sum(cpu.get(n, 0) for cpu in per_run))
    parts = []
    for name in names:
        ms = median([1000 * cpu.get(name, 0.0) / n for n, cpu in zip(tasks, per_run, strict=True)])
        if ms >= 0.005:
            parts.append(f"{name} {ms:.2f}")
    return ", ".join(parts) + " ms"


def _by_kind(cpu_s: dict[str, float]) -> dict[str, float]:
    """CPU seconds by the first word of each process's name."""
    kinds: dict[str, float] = {}
    for name, seconds in cpu_s.items():
        kind = name.split(" ")[0]
        kinds[kind] = kinds.get(kind, 0.0) + seconds
    return kinds


def _submit_figures(
    ctx: Context, ours: list[list[DevschedRun]], theirs: list[list[PeerRun]], peer_name: str | None, note: str
) -> None:
    """The submit figures: each round's over all its c, then the median of the rounds."""
    if not ours:
        return
    rates, scheduler_ms, server_ms, commits = [], [], [], []
    for runs in ours:
        tasks = sum(r.tasks for r in runs)
        rates.append(tasks / sum(r.submit_s for r in runs))
        scheduler_ms.append(1000 * sum(r.submit_cpu_s.get("scheduler", 0.0) for r in runs) / tasks)
        server_ms.append(
            1000 * sum(r.submit_cpu_s.get(t, 0.0) for r in runs for t in ("scheduler", "postgres", "nats")) / tasks
        )
        commits.append(sum(r.submit_counted.commits for r in runs) / tasks)
    peer_rates: list[float] = []
    peer_rate = peer_ms = peer_commits = None
    if theirs:
        peer_rates = [sum(p.jobs for p in ps) / sum(p.defer_s for p in ps) for ps in theirs]
        peer_rate = median(peer_rates)
        peer_ms = median([
            1000 * sum(p.defer_cpu_s.get("postgres", 0.0) for p in ps) / sum(p.jobs for p in ps) for ps in theirs
        ])  # fmt: skip
        peer_commits = median([sum(p.defer_counted.commits for p in ps) / sum(p.jobs for p in ps) for ps in theirs])
    rates_note = "; ".join(filter(None, [note, rounds_note(rates, peer_rates)]))
    ctx.figures += [
        Figure("lifecycle.submit.per_s", "submits/s, one by one", "submits/s", median(rates), peer_rate, peer_name,
               at_least(1.0), rates_note),
        Figure("lifecycle.submit.scheduler_cpu_ms", "scheduler CPU ms/submit", "ms", median(scheduler_ms),
               note=rounds_note(scheduler_ms)),
        Figure("lifecycle.submit.server_cpu_ms", "server CPU ms/submit (scheduler+Postgres+NATS)", "ms",
               median(server_ms), peer_ms, None if peer_ms is None else f"{peer_name} (Postgres)",
               note=note),
        Figure("lifecycle.submit.commits", "commits/submit", "commits", median(commits), peer_commits, peer_name,
               note=note),
    ]  # fmt: skip
