"""The renewal figures: 64 requesters each renewing its own claimed lease as fast as it is answered.

The requesters share 8 hosts of 8 devices, one NATS connection per host with the host's inbox prefix
(as the agent does). Beside them, in the same run and with the same 64 requesters on the same
connections: a bare nats-py request/reply echo (the NATS floor), a raw one-row `UPDATE` from a pool of 20
connections (the Postgres floor), and the renewal floor: a nats-py responder process that runs one
asyncpg `UPDATE ... RETURNING` per request on the same Postgres. Server-side CPU per renewal is the
scheduler's (or the responder's) and Postgres's.

Host-batched renewals (batched.py) measure the same 64 leases as 8 hosts each sending one `renewals`
request of its 8 leases, back to back, beside the batch floor: a responder running one set-based
`UPDATE ... FROM unnest(...) RETURNING` per request.

The renewal floor, devsched's renewals, devsched's batched renewals and the batch floor take turns in
`rounds` (in that order in odd rounds, reversed in even ones): on a shared machine one 8 s window can
differ from the next by half, so each renewal figure is that of the round whose ratio of devsched to
what it is beside is the median, with every round's values in its note.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from devsched.bench.batched import (
    FLOOR_SERVER,
    LEASES_PER_REQUEST,
    SERVER,
    Batched,
    BatchedRound,
    batched_details,
    batched_figures,
)
from devsched.bench.context import NOOP_PLAN, Context
from devsched.bench.figures import Figure, at_least, at_most, median, of_median_ratio
from devsched.bench.hosts import BenchHost, checked, lease_of, renewed
from devsched.bench.load import Request, Window, closed_loop
from devsched.bench.options import DEVICES_PER_HOST, REQUESTERS
from devsched.bench.pgstats import Statement, added, between, commits_in
from devsched.bench.profiling import PySpy, statement_summary
from devsched.bench.responders import FLOOR_NAME, FLOOR_RENEW, FLOOR_TABLE, Responder
from devsched.bench.servers import DATABASE, FLOOR_DATABASE, PREFIX
from devsched.protocol.subjects import HostVerb

#: Connections of the raw UPDATE's and the floor responder's pools (the scheduler's 10 + 10 overflow).
POOL = 20
ECHO_SUBJECT = "bench.echo"
FLOOR_PREFIX = "bench.floor"


@dataclass(frozen=True, slots=True)
class Batch:
    """One host's batched request: its leases and the body that lists them."""

    host: BenchHost
    leases: list[dict[str, Any]]
    body: bytes

    @classmethod
    def of(cls, host: BenchHost, leases: list[dict[str, Any]]) -> Batch:
        """The request of `leases` (each what a `renew` carries) by `host`."""
        return cls(host, leases, json.dumps({"leases": leases}).encode())

    async def send(self, subject: str) -> int:
        """Send it to `subject`; returns the leases renewed (all of them, or it raises)."""
        assert self.host.nc is not None
        return renewed(await self.host.nc.request(subject, self.body, timeout=30), self.leases)


@dataclass
class Rig:
    """64 claimed leases on 8 protocol-speaking hosts, renewed by requester i = lease i."""

    hosts: list[BenchHost] = field(default_factory=list)
    leases: list[tuple[BenchHost, bytes]] = field(default_factory=list)
    floor_leases: list[tuple[BenchHost, str, bytes]] = field(default_factory=list)
    batches: list[Batch] = field(default_factory=list)
    """Host h's `renewals` request of its 8 leases (the same leases as requesters 8h to 8h + 7)."""
    floor_batches: list[Batch] = field(default_factory=list)
    """Host h's request of its 8 floor leases to the batch floor."""
    renewed: int = 0
    """Leases the batched requests renewed so far, counted from their replies."""

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
        for h, host in enumerate(self.hosts):
            own = slice(h * DEVICES_PER_HOST, (h + 1) * DEVICES_PER_HOST)
            self.batches.append(Batch.of(host, [json.loads(body) for _, body in self.leases[own]]))
            self.floor_batches.append(Batch.of(host, [json.loads(body) for _, _, body in self.floor_leases[own]]))

    async def renew(self, i: int) -> None:
        """Renew lease `i` once (an error reply raises)."""
        host, body = self.leases[i]
        assert host.nc is not None
        checked(await host.nc.request(host.subject("renew"), body, timeout=30))

    async def renew_batch(self, h: int) -> None:
        """Renew host `h`'s leases in one `renewals` request (a lease not renewed raises)."""
        batch = self.batches[h]
        count = await batch.send(batch.host.subject(HostVerb.RENEWALS))
        self.renewed += count  # after the await: `self.renewed += await ...` reads it before, losing counts

    async def close(self) -> None:
        """Close every host."""
        for host in self.hosts:
            await host.close()


async def renewals_phase(ctx: Context, rig: Rig) -> None:
    """The floors, then devsched's renewals; adds the renewal figures."""
    import asyncpg  # type: ignore[import-untyped]

    sizes, stack = ctx.sizes, ctx.stack
    ctx.say(
        f"renewals: {REQUESTERS} requesters over {len(rig.hosts)} hosts, then each host's {LEASES_PER_REQUEST}"
        f" leases in one request, {sizes.window_s:g} s windows"
    )
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
    batch_responder = Responder("batch", stack.nats_url, f"{FLOOR_PREFIX}.*.renewals", floor_dsn, str(POOL))
    floors: list[Window] = []
    batch_floors: list[Batched] = []
    #: devsched's loads with the statements and the transaction ids they cost its database
    renew_loads: list[tuple[Window, list[Statement], int]] = []
    batched_loads: list[tuple[Batched, list[Statement], int]] = []
    spied: dict[str, list[PySpy]] = {}

    def profile(name: str) -> Callable[[bool], None]:
        def on_window(opening: bool) -> None:
            if opening:
                spied[name] = [spy for spy in [ctx.spy(name)] if spy is not None]
            else:
                for spy in spied[name]:
                    ctx.stop_spy(spy)

        return on_window

    async def floor_once(i: int) -> None:
        host, _, body = rig.floor_leases[i]
        assert host.nc is not None
        checked(await host.nc.request(f"{FLOOR_PREFIX}.{host.host_id}.renew", body, timeout=30))

    floor_renewed = 0

    async def floor_batch_once(h: int) -> None:
        nonlocal floor_renewed
        batch = rig.floor_batches[h]
        count = await batch.send(f"{FLOOR_PREFIX}.{batch.host.host_id}.renewals")
        floor_renewed += count

    scheduler = {"scheduler": stack.pids()["scheduler"]}
    hosts = len(rig.hosts)

    async def devsched_load(
        name: str, request: Request, requesters: int, per_request: int, spy: str | None
    ) -> tuple[Window, list[Statement], int]:
        statements, xid = await ctx.pg.statements(DATABASE), (await ctx.pg.counters(DATABASE)).next_xid
        on_window = None if spy is None else profile(spy)
        window = await _measure(
            ctx, name, request, scheduler, requesters=requesters, per_request=per_request, on_window=on_window
        )
        ran = between(statements, await ctx.pg.statements(DATABASE))
        return window, ran, (await ctx.pg.counters(DATABASE)).next_xid - xid

    rounds = sizes.rounds
    before = await ctx.pg.counters(DATABASE)
    await ctx.pg.reset_statements()
    await responder.start()
    try:
        await batch_responder.start()
        for r in range(1, rounds + 1):
            tag = f" {r}/{rounds}" if rounds > 1 else ""
            # each load next to what it is beside, the order reversed in even rounds: none always gets the
            # warmer minute
            sides = ("floor", "renew", "batched", "batch floor")
            for side in sides if r % 2 else reversed(sides):
                if side == "floor":
                    floors.append(await _measure(ctx, f"renewal floor{tag}", floor_once, {"responder": responder.pid}))
                elif side == "renew":
                    spy = "scheduler-renewals" if r == 1 else None
                    renew_loads.append(await devsched_load(f"devsched renew{tag}", rig.renew, REQUESTERS, 1, spy))
                elif side == "batch floor":
                    renewed_before = floor_renewed
                    window = await _measure(
                        ctx,
                        f"batch floor{tag}",
                        floor_batch_once,
                        {"responder": batch_responder.pid},
                        requesters=hosts,
                        per_request=LEASES_PER_REQUEST,
                    )
                    batch_floors.append(Batched(window, floor_renewed - renewed_before, FLOOR_SERVER))
                else:
                    renewed_before, spy = rig.renewed, "scheduler-renewals-batched" if r == 1 else None
                    window, ran, xids = await devsched_load(
                        f"devsched renewals{tag}", rig.renew_batch, hosts, LEASES_PER_REQUEST, spy
                    )
                    batched_loads.append((Batched(window, rig.renewed - renewed_before, SERVER), ran, xids))
    finally:
        responder.stop()
        batch_responder.stop()
    counted, _ = await ctx.pg.settled(DATABASE, before, ctx.sizes.settle_s)
    renews = [w for w, _, _ in renew_loads]
    batched = [
        BatchedRound(load, floor, ran, xids)
        for (load, ran, xids), floor in zip(batched_loads, batch_floors, strict=True)
    ]
    statements = added([ran for _, ran, _ in renew_loads])
    batched_statements = added([b.statements for b in batched])
    renewals = sum(w.total for w in renews)
    batched_requests = sum(b.devsched.window.total for b in batched)
    ctx.sql_profiles["renewals"] = (statements, renewals, "renewal")
    ctx.sql_profiles[f"renewals in batches of {LEASES_PER_REQUEST}"] = (
        batched_statements,
        sum(b.devsched.leases for b in batched),
        "lease",
    )
    for profiled in spied.get("scheduler-renewals", []):
        ctx.spied[profiled.output.stem] = (renews[0].count, "renewal", renews[0].cpu_s.get("scheduler", 0.0))
    first = batched[0].devsched.window
    for profiled in spied.get("scheduler-renewals-batched", []):
        ctx.spied[profiled.output.stem] = (first.count * LEASES_PER_REQUEST, "lease", first.cpu_s.get("scheduler", 0.0))
    floor_after = await ctx.pg.counters(FLOOR_DATABASE)

    _figures(ctx, renews, floors, echo=windows["echo"], update=windows["update"])
    batched_figures(ctx.figures, batched, floors)
    floor_requests = sum(w.total for w in floors) + sum(b.window.total for b in batch_floors)
    ctx.details["renewals"] = {
        "requesters": REQUESTERS,
        "hosts": hosts,
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
        # pg_stat_database reports late, so it cannot tell the windows apart: the commits of both loads, per
        # request of either (each one transaction)
        "commits_per_request": round(counted.commits / max(renewals + batched_requests, 1), 3),
        "write_transactions_per_renewal": round(sum(xids for _, _, xids in renew_loads) / max(renewals, 1), 3),
        "commit_statements_per_renewal": round(commits_in(statements) / max(renewals, 1), 3),
        "floor_commits_per_request": round((floor_after.commits - floor_before.commits) / max(floor_requests, 1), 3),
        "sql": statement_summary(statements, renewals),
        "batched": batched_details(batched, batched_statements),
    }  # fmt: skip
    named = {"nats echo": windows["echo"], "raw UPDATE": windows["update"], "renewal floor": _median_window(floors),
             "devsched renew": _median_window(renews)}  # fmt: skip
    for name, w in named.items():
        ctx.samples[f"{name} ({REQUESTERS} concurrent)"] = w.latencies_ms
    by_rate = sorted(batched, key=lambda b: b.devsched.window.rate)[(len(batched) - 1) // 2]
    ctx.samples[f"devsched renewals of {LEASES_PER_REQUEST} ({hosts} hosts)"] = by_rate.devsched.window.latencies_ms


def _median_window(rounds: Sequence[Window]) -> Window:
    """The round whose rate is the median (the lower middle one of an even number)."""
    ordered = sorted(rounds, key=lambda w: w.rate)
    return ordered[(len(ordered) - 1) // 2]


async def _measure(
    ctx: Context,
    name: str,
    request: Request,
    extra_trees: dict[str, int | None],
    *,
    requesters: int = REQUESTERS,
    per_request: int = 1,
    on_window: Callable[[bool], object] | None = None,
) -> Window:
    """`requesters` loops of `request`; says its rate (of leases, `per_request` a request) and latency."""
    meter = ctx.meter("postgres", "nats")
    meter.roots.update(extra_trees)
    window = await closed_loop(
        name,
        request,
        requesters,
        warmup_s=ctx.sizes.warmup_s,
        window_s=ctx.sizes.window_s,
        meter=meter,
        on_window=on_window,
    )
    lat = window.latency
    rate = f"{window.rate * per_request:>8.0f}/s" + (f" ({window.rate:.0f} requests/s)" if per_request > 1 else "")
    ctx.say(f"  {name:<22} {rate}  p50 {lat.p50_ms:6.2f} ms  p99 {lat.p99_ms:6.2f} ms")
    return window


def _figures(ctx: Context, renews: Sequence[Window], floors: Sequence[Window], *, echo: Window, update: Window) -> None:
    """The renewal figures, each from the round whose ratio of devsched to the floor is the median.

    Every process's CPU per request, the load generator's too, moved by half between rounds on a shared
    machine: a round's ratio cancels most of that (`of_median_ratio`). The note lists each round's.
    """
    server = ("scheduler", "postgres")
    floor_server = ("responder", "postgres")
    typical = _median_window(renews)
    busy = ", ".join(f"{t} {typical.cpu_s.get(t, 0.0) / typical.seconds:.0%}" for t in ("scheduler", "postgres"))

    def paired(
        of: Callable[[Window], float], floor_of: Callable[[Window], float] | None = None
    ) -> tuple[float, float, str]:
        return of_median_ratio([(of(w), (floor_of or of)(f)) for w, f in zip(renews, floors, strict=True)])

    rate, floor_rate, rate_note = paired(lambda w: w.rate)
    p50, floor_p50, _ = paired(lambda w: w.latency.p50_ms)
    p99, floor_p99, p99_note = paired(lambda w: w.latency.p99_ms)
    cpu, floor_cpu, cpu_note = paired(
        lambda w: w.cpu_ms_per_request(*server), lambda w: w.cpu_ms_per_request(*floor_server)
    )
    pg_cpu = median([w.cpu_ms_per_request("postgres") for w in renews])
    ctx.figures += [
        Figure("renewals.per_s", "renewals/s, 64 concurrent", "renewals/s", rate, floor_rate, FLOOR_NAME,
               at_least(0.8), note="; ".join(filter(None, [f"of one core: {busy}", rate_note]))),
        Figure("renewals.p50_ms", "renewal p50", "ms", p50, floor_p50, FLOOR_NAME),
        Figure("renewals.p99_ms", "renewal p99", "ms", p99, floor_p99, FLOOR_NAME, at_most(1.5), note=p99_note),
        Figure("renewals.server_cpu_ms", "server CPU ms/renewal (scheduler+Postgres)", "ms",
               cpu, floor_cpu, FLOOR_NAME, at_most(1.5), note=cpu_note),
        Figure("renewals.vs_echo_per_s", "renewals/s beside the bare echo", "renewals/s", rate, echo.rate,
               "floor: nats-py request/reply echo"),
        Figure("renewals.vs_update_per_s", "renewals/s beside a raw one-row UPDATE", "renewals/s", rate,
               update.rate, f"floor: one-row UPDATE, pool of {POOL}"),
        Figure("renewals.vs_update_cpu_ms", "Postgres CPU ms/renewal beside a raw UPDATE", "ms",
               pg_cpu, update.cpu_ms_per_request("postgres"), f"floor: one-row UPDATE, pool of {POOL}"),
    ]  # fmt: skip
