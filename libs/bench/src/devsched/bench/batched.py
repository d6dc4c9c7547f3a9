"""The host-batched renewal figures: each of 8 hosts renews its 8 leases in one `renewals` request, back to back.

They run in the renewals phase's rounds, beside two floors of the same round: the per-lease floor, whose
server CPU per renewal is what the batched renewals' server CPU per lease is held to (batching is worth
its protocol when it costs far less than the cheapest per-lease renewal), and the batch floor, a nats-py
responder running one set-based `UPDATE ... FROM unnest(...) RETURNING` per request, beside the rate.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from devsched.bench.figures import Figure, at_most, of_median_ratio
from devsched.bench.load import Window
from devsched.bench.options import DEVICES_PER_HOST
from devsched.bench.pgstats import Statement, commits_in
from devsched.bench.profiling import statement_summary
from devsched.bench.responders import BATCH_FLOOR_NAME, FLOOR_NAME

#: Leases in each batched request: a host's devices.
LEASES_PER_REQUEST = DEVICES_PER_HOST
SERVER = ("scheduler", "postgres")
FLOOR_SERVER = ("responder", "postgres")


@dataclass(frozen=True, slots=True)
class Batched:
    """One batched load (devsched's or the batch floor's) and the leases its replies said it renewed."""

    window: Window
    leases: int
    """Leases renewed over the whole load, warm-up included (what `window.total` requests renewed)."""
    server: tuple[str, ...]
    """Its server's process trees (the scheduler's or the responder's, and Postgres)."""

    @property
    def leases_per_s(self) -> float:
        """Leases renewed per second in the window."""
        return self.window.rate * LEASES_PER_REQUEST

    @property
    def cpu_ms_per_lease(self) -> float:
        """Server CPU milliseconds per lease renewed in the window."""
        return self.window.cpu_ms_per_request(*self.server) / LEASES_PER_REQUEST

    def as_dict(self) -> dict[str, Any]:
        """For the JSON output: the window (its counts are requests), and the leases."""
        return {
            **self.window.as_dict(),
            "requests": self.window.total,
            "leases_renewed": self.leases,
            "leases_per_s": round(self.leases_per_s, 1),
            "server_cpu_ms_per_lease": round(self.cpu_ms_per_lease, 4),
        }


@dataclass(frozen=True, slots=True)
class BatchedRound:
    """A round's batched loads and what they wrote in the devsched database."""

    devsched: Batched
    floor: Batched
    statements: list[Statement]
    """The devsched database's statements over devsched's load."""
    write_transactions: int
    """Transaction ids assigned over devsched's load."""


def batched_figures(figures: list[Figure], rounds: Sequence[BatchedRound], per_lease_floors: Sequence[Window]) -> None:
    """Add the batched figures, each from the round whose ratio to what it is beside is the median."""
    rate, floor_rate, rate_note = of_median_ratio([(r.devsched.leases_per_s, r.floor.leases_per_s) for r in rounds])
    cpu, floor_cpu, cpu_note = of_median_ratio(
        [(r.devsched.cpu_ms_per_lease, f.cpu_ms_per_request(*FLOOR_SERVER))
         for r, f in zip(rounds, per_lease_floors, strict=True)]
    )  # fmt: skip
    own, batch_floor_cpu, own_note = of_median_ratio(
        [(r.devsched.cpu_ms_per_lease, r.floor.cpu_ms_per_lease) for r in rounds]
    )
    typical = _median_round(rounds).devsched.window
    busy = ", ".join(f"{t} {typical.cpu_s.get(t, 0.0) / typical.seconds:.0%}" for t in SERVER)
    hosts = typical.requesters
    figures += [
        Figure("renewals.batched.leases_per_s", f"leases/s, {hosts} hosts x renewals of {LEASES_PER_REQUEST}",
               "leases/s", rate, floor_rate, BATCH_FLOOR_NAME,
               note="; ".join(filter(None, [f"of one core: {busy}", rate_note]))),
        Figure("renewals.batched.server_cpu_ms_per_lease",
               "batched server CPU ms/lease (scheduler+Postgres)", "ms",
               cpu, floor_cpu, f"{FLOOR_NAME}, per renewal", at_most(0.3), note=cpu_note),
        Figure("renewals.batched.vs_batch_floor_cpu_ms",
               "batched server CPU ms/lease beside the batch floor", "ms",
               own, batch_floor_cpu, f"{BATCH_FLOOR_NAME} (responder+Postgres)", note=own_note),
    ]  # fmt: skip


def batched_details(rounds: Sequence[BatchedRound], statements: list[Statement]) -> dict[str, Any]:
    """For the JSON output: each round's loads, and what devsched's cost the database per request and lease."""
    requests = sum(r.devsched.window.total for r in rounds)
    leases = sum(r.devsched.leases for r in rounds)
    renewals = [s for s in statements if _is_renewals(s.query)]
    typical = _median_round(rounds)
    return {
        "hosts": rounds[0].devsched.window.requesters,
        "leases_per_request": LEASES_PER_REQUEST,
        "windows": {"devsched": typical.devsched.as_dict(), "floor": typical.floor.as_dict()},
        "round_windows": [{"round": n, "devsched": r.devsched.as_dict(), "floor": r.floor.as_dict()}
                          for n, r in enumerate(rounds, start=1)],
        "requests_total": requests,
        "leases_renewed_total": leases,
        "write_transactions_per_request": round(sum(r.write_transactions for r in rounds) / max(requests, 1), 3),
        "commit_statements_per_request": round(commits_in(statements) / max(requests, 1), 3),
        # the one statement of a request whose leases are all granted: its calls and the rows it renewed
        "renewals_statement": {"calls": sum(s.calls for s in renewals), "rows": sum(s.rows for s in renewals)},
        "sql": statement_summary(statements, leases),
    }  # fmt: skip


def _is_renewals(query: str) -> bool:
    """The store's `renewals` statement (an `UPDATE attempts` over the list's `unnest`), in pg_stat_statements."""
    return "unnest(" in query and "UPDATE attempts" in query


def _median_round(rounds: Sequence[BatchedRound]) -> BatchedRound:
    """The round whose batched rate is the median (the lower middle one of an even number)."""
    ordered = sorted(rounds, key=lambda r: r.devsched.window.rate)
    return ordered[(len(ordered) - 1) // 2]
