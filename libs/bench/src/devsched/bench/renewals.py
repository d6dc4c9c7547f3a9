"""The renewal figures: 64 requesters each renewing its own claimed lease as fast as it is answered.

The requesters share 8 hosts of 8 devices, one NATS connection per host with the host's inbox prefix
(as the agent does). Beside them, in the same run and with the same 64 requesters on the same
connections: a bare nats-py request/reply echo (the NATS floor), a raw one-row `UPDATE` from a pool of 20
connections (the Postgres floor), and the renewal floor: a nats-py responder process that runs one
asyncpg `UPDATE ... RETURNING` per request on the same Postgres. Server-side CPU per renewal is the
scheduler's (or the responder's) and Postgres's.

The renewal floor and devsched's renewals take turns in `rounds` (the floor first in odd rounds): on a
shared machine one 8 s window of either can differ from the next by half, so each renewal figure is that
of the round whose ratio of devsched to the floor is the median, with every round's values in its note.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from devsched.bench.context import NOOP_PLAN, Context
from devsched.bench.figures import Figure, at_least, at_most, median, rounds_note
from devsched.bench.hosts import BenchHost, checked, lease_of
from devsched.bench.load import Request, Window, closed_loop
from devsched.bench.options import DEVICES_PER_HOST, REQUESTERS
from devsched.bench.pgstats import commits_in
from devsched.bench.profiling import PySpy, statement_summary
from devsched.bench.responders import FLOOR_RENEW, FLOOR_TABLE, Responder
from devsched.bench.servers import DATABASE, FLOOR_DATABASE, PREFIX

#: Connections of the raw UPDATE's and the floor responder's pools (the scheduler's 10 + 10 overflow).
POOL = 20
ECHO_SUBJECT = "bench.echo"
FLOOR_PREFIX = "bench.floor"


@dataclass
class Rig:
    """64 claimed leases on 8 protocol-speaking hosts, renewed by requester i = lease i."""

    hosts: list[BenchHost] = field(default_factory=list)
    leases: list[tuple[BenchHost, bytes]] = field(default_factory=list)
    floor_leases: list[tuple[BenchHost, str, bytes]] = field(default_factory=list)

    async def setup(self, ctx: Context) -> None:
        """Register the hosts, submit and claim one long lease per device."""
        labels = {"bench": "renewals"}
        interval = 5.0
        for h in range(REQUESTERS // DEVICES_PER_HOST):
            host = BenchHost(ctx.stack.nats_url, PREFIX, f"bench-r{h}")
            await host.connect()
            interval = await host.register([(f"bench-r{h}-d{d}", labels) for d in range(DEVICES_PER_HOST)])
            await host.bind()
            self.hosts.append(host)
        for _ in range(REQUESTERS):
            await ctx.client.submit(NOOP_PLAN, selector=labels, lease_ttl_s=3600, max_attempts=1)
        for host in self.hosts:
            for assignment in await host.assignments(DEVICES_PER_HOST, timeout=60):
                await host.claim(assignment)
                self.leases.append((host, json.dumps(lease_of(assignment)).encode()))
            host.start_heartbeats(interval)
        for i, (_, body) in enumerate(self.leases):
            floor_id = str(uuid.uuid4())
            floor_body = json.dumps({**json.loads(body), "lease_id": floor_id}).encode()
            self.floor_leases.append((self.hosts[i // DEVICES_PER_HOST], floor_id, floor_body))

    async def renew(self, i: int) -> None:
        """Renew lease `i` once (an error reply raises)."""
        host, body = self.leases[i]
        assert host.nc is not None
        checked(await host.nc.request(host.subject("renew"), body, timeout=30))

    async def close(self) -> None:
        """Close every host."""
        for host in self.hosts:
            await host.close()


async def renewals_phase(ctx: Context, rig: Rig) -> None:
    """The floors, then devsched's renewals; adds the renewal figures."""
    import asyncpg  # type: ignore[import-untyped]

    sizes, stack = ctx.sizes, ctx.stack
    ctx.say(f"renewals: {REQUESTERS} requesters over {len(rig.hosts)} hosts, {sizes.window_s:g} s windows")
    floor_dsn = stack.admin_dsn(FLOOR_DATABASE)
    conn = await asyncpg.connect(floor_dsn)
    try:
        await conn.execute(FLOOR_TABLE)
        await conn.executemany(
            "INSERT INTO floor_leases VALUES ($1, $2, now())",
            [(lease_id, host.host_id) for host, lease_id, _ in rig.floor_leases],
        )
    finally:
        await conn.close()

    windows: dict[str, Window] = {}
    payload = rig.leases[0][1]

    echo = Responder("echo", stack.nats_url, ECHO_SUBJECT)
    await echo.start()
    try:

        async def echo_once(i: int) -> None:
            host = rig.floor_leases[i][0]
            assert host.nc is not None
            await host.nc.request(ECHO_SUBJECT, payload, timeout=30)

        windows["echo"] = await _measure(ctx, "nats echo", echo_once, {"responder": echo.pid})
    finally:
        echo.stop()

    pool = await asyncpg.create_pool(floor_dsn, min_size=POOL, max_size=POOL)
    try:

        async def update_once(i: int) -> None:
            host, lease_id, _ = rig.floor_leases[i]
            await pool.fetchval(FLOOR_RENEW, lease_id, host.host_id)

        windows["update"] = await _measure(ctx, "raw UPDATE", update_once, {})
    finally:
        await pool.close()

    floor_before = await ctx.pg.counters(FLOOR_DATABASE)
    responder = Responder("update", stack.nats_url, f"{FLOOR_PREFIX}.*.renew", floor_dsn, str(POOL))
    await responder.start()
    floors: list[Window] = []
    renews: list[Window] = []
    spies: list[PySpy] = []

    def profile(opening: bool) -> None:
        if opening:
            spies.extend(spy for spy in [ctx.spy("scheduler-renewals")] if spy is not None)
        else:
            for spy in spies:
                ctx.stop_spy(spy)

    async def floor_once(i: int) -> None:
        host, _, body = rig.floor_leases[i]
        assert host.nc is not None
        checked(await host.nc.request(f"{FLOOR_PREFIX}.{host.host_id}.renew", body, timeout=30))

    rounds = sizes.rounds
    before = await ctx.pg.counters(DATABASE)
    await ctx.pg.reset_statements()
    try:
        for r in range(1, rounds + 1):
            tag = f" {r}/{rounds}" if rounds > 1 else ""
            # the floor first in odd rounds, devsched first in even ones: neither always gets the warmer minute
            for side in ("floor", "renew") if r % 2 else ("renew", "floor"):
                if side == "floor":
                    floors.append(await _measure(ctx, f"renewal floor{tag}", floor_once, {"responder": responder.pid}))
                else:
                    renews.append(
                        await _measure(
                            ctx, f"devsched renew{tag}", rig.renew, {"scheduler": stack.pids()["scheduler"]},
                            on_window=profile if r == 1 else None,
                        )
                    )  # fmt: skip
    finally:
        responder.stop()
    statements = await ctx.pg.statements(DATABASE)
    counted, _ = await ctx.pg.settled(DATABASE, before, ctx.sizes.settle_s)
    renewals = sum(w.total for w in renews)
    ctx.sql_profiles["renewals"] = (statements, renewals, "renewal")
    for spy in spies:
        ctx.spied[spy.output.stem] = (renews[0].count, "renewal", renews[0].cpu_s.get("scheduler", 0.0))
    floor_after = await ctx.pg.counters(FLOOR_DATABASE)

    _figures(ctx, renews, floors, echo=windows["echo"], update=windows["update"])
    ctx.details["renewals"] = {
        "requesters": REQUESTERS,
        "hosts": len(rig.hosts),
        "rounds": rounds,
        "windows": {
            **{name: w.as_dict() for name, w in windows.items()},
            # the median round's (by rate), as before rounds
            "floor": _median_window(floors).as_dict(),
            "renew": _median_window(renews).as_dict(),
        },
        "round_windows": [{"round": r, "floor": f.as_dict(), "renew": w.as_dict()}
                          for r, (f, w) in enumerate(zip(floors, renews, strict=True), start=1)],
        "renewals_total": renewals,
        "commits_per_renewal": round(counted.commits / max(renewals, 1), 3),
        "write_transactions_per_renewal": round(counted.write_transactions / max(renewals, 1), 3),
        "commit_statements_per_renewal": round(commits_in(statements) / max(renewals, 1), 3),
        "floor_commits_per_renewal": round(
            (floor_after.commits - floor_before.commits) / max(sum(w.total for w in floors), 1), 3
        ),
        "sql": statement_summary(statements, renewals),
    }  # fmt: skip
    named = {"nats echo": windows["echo"], "raw UPDATE": windows["update"], "renewal floor": _median_window(floors),
             "devsched renew": _median_window(renews)}  # fmt: skip
    for name, w in named.items():
        ctx.samples[f"{name} ({REQUESTERS} concurrent)"] = w.latencies_ms


def _median_window(rounds: Sequence[Window]) -> Window:
    """The round whose rate is the median (the lower middle one of an even number)."""
    ordered = sorted(rounds, key=lambda w: w.rate)
    return ordered[(len(ordered) - 1) // 2]


async def _measure(
    ctx: Context,
    name: str,
    request: Request,
    extra_trees: dict[str, int | None],
    on_window: Callable[[bool], object] | None = None,
) -> Window:
    meter = ctx.meter("postgres", "nats")
    meter.roots.update(extra_trees)
    window = await closed_loop(
        name,
        request,
        REQUESTERS,
        warmup_s=ctx.sizes.warmup_s,
        window_s=ctx.sizes.window_s,
        meter=meter,
        on_window=on_window,
    )
    lat = window.latency
    ctx.say(f"  {name:<16} {window.rate:>8.0f}/s  p50 {lat.p50_ms:6.2f} ms  p99 {lat.p99_ms:6.2f} ms")
    return window


def _figures(ctx: Context, renews: Sequence[Window], floors: Sequence[Window], *, echo: Window, update: Window) -> None:
    """The renewal figures, each from the round whose ratio of devsched to the floor is the median.

    A round's two windows are adjacent in time, so its ratio cancels most of what a shared machine's slow
    minute does to both (every process's CPU per request, the load generator's too, moved by half between
    rounds); the median of the rounds' ratios is that round's pair of values. The note lists each round's.
    """
    floor_name = "floor: nats-py responder, one UPDATE ... RETURNING"
    server = ("scheduler", "postgres")
    floor_server = ("responder", "postgres")
    typical = _median_window(renews)
    busy = ", ".join(f"{t} {typical.cpu_s.get(t, 0.0) / typical.seconds:.0%}" for t in ("scheduler", "postgres"))

    def paired(
        of: Callable[[Window], float], floor_of: Callable[[Window], float] | None = None
    ) -> tuple[float, float, str]:
        pairs = [(of(w), (floor_of or of)(f)) for w, f in zip(renews, floors, strict=True)]
        ratios = [value / beside if beside else 0.0 for value, beside in pairs]
        middle = sorted(range(len(pairs)), key=lambda i: ratios[i])[(len(pairs) - 1) // 2]
        note = rounds_note([v for v, _ in pairs], [b for _, b in pairs], "floor", "the median ratio")
        if note:
            note += " (x " + " / ".join(f"{r:.2f}" for r in ratios) + ")"
        return pairs[middle][0], pairs[middle][1], note

    rate, floor_rate, rate_note = paired(lambda w: w.rate)
    p50, floor_p50, _ = paired(lambda w: w.latency.p50_ms)
    p99, floor_p99, p99_note = paired(lambda w: w.latency.p99_ms)
    cpu, floor_cpu, cpu_note = paired(
        lambda w: w.cpu_ms_per_request(*server), lambda w: w.cpu_ms_per_request(*floor_server)
    )
    pg_cpu = median([w.cpu_ms_per_request("postgres") for w in renews])
    ctx.figures += [
        Figure("renewals.per_s", "renewals/s, 64 concurrent", "renewals/s", rate, floor_rate, floor_name,
               at_least(0.8), note="; ".join(filter(None, [f"of one core: {busy}", rate_note]))),
        Figure("renewals.p50_ms", "renewal p50", "ms", p50, floor_p50, floor_name),
        Figure("renewals.p99_ms", "renewal p99", "ms", p99, floor_p99, floor_name, at_most(1.5), note=p99_note),
        Figure("renewals.server_cpu_ms", "server CPU ms/renewal (scheduler+Postgres)", "ms",
               cpu, floor_cpu, floor_name, at_most(1.5), note=cpu_note),
        Figure("renewals.vs_echo_per_s", "renewals/s beside the bare echo", "renewals/s", rate, echo.rate,
               "floor: nats-py request/reply echo"),
        Figure("renewals.vs_update_per_s", "renewals/s beside a raw one-row UPDATE", "renewals/s", rate,
               update.rate, f"floor: one-row UPDATE, pool of {POOL}"),
        Figure("renewals.vs_update_cpu_ms", "Postgres CPU ms/renewal beside a raw UPDATE", "ms",
               pg_cpu, update.cpu_ms_per_request("postgres"), f"floor: one-row UPDATE, pool of {POOL}"),
    ]  # fmt: skip
