"""`devsched bench --quick` as a user runs it: every figure measured, ratios of the same run, a PNG, profiles.

A smoke test of the measuring instrument, not a measurement: it asserts no timing, only that each figure
was measured (a positive rate, a latency, a CPU time) beside what it is compared with, that each ratio is
the quotient of the two figures printed beside it, and that the run cleans up after itself.
"""

from __future__ import annotations

import json
import re
import statistics
import subprocess
from pathlib import Path
from typing import Any

import pytest

from support.devsched_stack import run_devsched

pytestmark = pytest.mark.e2e

CONCURRENCY = (1, 16)
#: Lifecycle rounds at each c, and renewal rounds (a full run's default is 3; quick's 1).
ROUNDS = 2
#: Every figure of a full run of every phase, and what it is measured beside (None: nothing).
FIGURES: dict[str, str | None] = {
    **{
        f"lifecycle.c{c}.{name}": "Procrastinate"
        for c in CONCURRENCY
        for name in (
            "tasks_per_s",
            "cpu_ms_per_task",
            "commits_per_task",
            "wal_bytes_per_task",
            "row_versions_per_task",
            "wal_syncs_per_task",
        )
    },
    **{f"lifecycle.c{c}.statements_per_task": None for c in CONCURRENCY},
    **{f"lifecycle.c{c}.stream_messages_per_task": None for c in CONCURRENCY},
    **{
        f"lifecycle.c{c}.vs_floor_{name}": "the same rows"
        for c in CONCURRENCY
        for name in ("tasks_per_s", "cpu_ms_per_task")
    },
    "lifecycle.submit.per_s": "Procrastinate",
    "lifecycle.submit.scheduler_cpu_ms": None,
    "lifecycle.submit.server_cpu_ms": "Procrastinate",
    "lifecycle.submit.commits": "Procrastinate",
    "latency.single_task_p50_ms": None,
    "renewals.per_s": "floor",
    "renewals.p50_ms": "floor",
    "renewals.p99_ms": "floor",
    "renewals.server_cpu_ms": "floor",
    "renewals.vs_echo_per_s": "echo",
    "renewals.vs_update_per_s": "UPDATE",
    "renewals.vs_update_cpu_ms": "UPDATE",
    "renewals.batched.leases_per_s": "FROM unnest(...)",
    "renewals.batched.server_cpu_ms_per_lease": "one UPDATE ... RETURNING",
    "renewals.batched.vs_batch_floor_cpu_ms": "FROM unnest(...)",
    "sweep.seconds": "four rows",
    "sweep.cpu_ms_per_lease": "four rows",
    "sweep.renewal_p99_ms": "idle",
    "memory.rss_mb_shallow": None,
    "memory.rss_mb_deep": None,
    "memory.rss_growth": "RSS",
    "memory.get_ms": "queued",
    "memory.list_ms": "queued",
    "memory.submit_ms": "queued",
}
#: Figures that count something that may be zero in a quick run (its settles are too short for Postgres's
#: statistics to catch up, and a CPU time is read in 10 ms ticks).
MAY_BE_ZERO = re.compile(r"commits|cpu_ms|row_versions|wal_syncs")


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess[str], Path]:
    out = tmp_path_factory.mktemp("bench")
    result = run_devsched(
        "bench", "--quick", "--rounds", str(ROUNDS), "-c", ",".join(map(str, CONCURRENCY)),
        "--json", str(out / "bench.json"), "--plot", str(out / "bench.png"), "--profile", str(out / "profile"),
        timeout=360,
    )  # fmt: skip
    return result, out


@pytest.fixture(scope="module")
def document(quick_run: tuple[subprocess.CompletedProcess[str], Path]) -> dict[str, Any]:
    result, out = quick_run
    assert result.returncode == 0, f"stdout:\n{result.stdout[-4000:]}\nstderr:\n{result.stderr[-4000:]}"
    data = json.loads((out / "bench.json").read_text())
    assert isinstance(data, dict)
    return data


def test_every_figure_is_measured_beside_what_it_is_compared_with(document: dict[str, Any]) -> None:
    assert document["errors"] == []
    figures = {f["key"]: f for f in document["figures"]}
    assert set(figures) == set(FIGURES)
    for key, beside in FIGURES.items():
        figure = figures[key]
        value = figure["value"]
        assert isinstance(value, int | float), figure
        assert value >= 0 if MAY_BE_ZERO.search(key) else value > 0, figure
        if beside is None:
            assert figure["beside"] is None, figure
            continue
        assert beside in figure["beside_name"], figure
        assert figure["beside"] >= 0 if MAY_BE_ZERO.search(key) else figure["beside"] > 0, figure
        if figure["beside"] > 0:  # the ratio is the quotient of the two figures of this run
            assert figure["ratio"] == pytest.approx(value / figure["beside"], rel=1e-3, abs=1e-4), figure


def test_the_lifecycle_figures_are_the_medians_of_their_rounds(document: dict[str, Any]) -> None:
    lifecycle = document["details"]["lifecycle"]
    assert lifecycle["rounds"] == ROUNDS
    figures = {f["key"]: f for f in document["figures"]}
    for c in CONCURRENCY:
        at_c = [r for r in lifecycle["runs"] if r["devsched"]["concurrency"] == c]
        assert sorted(r["round"] for r in at_c) == list(range(1, ROUNDS + 1))
        assert len({r["devsched"]["tasks"] for r in at_c}) == 1
        figure = figures[f"lifecycle.c{c}.tasks_per_s"]
        # each round's rate is rounded to 0.1 in the details
        assert figure["value"] == pytest.approx(statistics.median(r["devsched"]["tasks_per_s"] for r in at_c), abs=0.1)
        assert figure["beside"] == pytest.approx(statistics.median(r["peer"]["jobs_per_s"] for r in at_c), abs=0.1)
        assert f"medians of {ROUNDS} rounds" in figure["note"]
        cpu = figures[f"lifecycle.c{c}.cpu_ms_per_task"]
        assert cpu["value"] == pytest.approx(
            statistics.median(r["devsched"]["cpu_ms_per_task"] for r in at_c), abs=1e-3
        )


def test_the_floor_runs_each_round_and_its_cpu_is_split_by_process(document: dict[str, Any]) -> None:
    figures = {f["key"]: f for f in document["figures"]}
    for c in CONCURRENCY:
        at_c = [r for r in document["details"]["lifecycle"]["runs"] if r["devsched"]["concurrency"] == c]
        floors = [r["floor"] for r in at_c]
        assert len(floors) == ROUNDS
        assert all(
            f["tasks"] == r["devsched"]["tasks"] and f["concurrency"] == c for f, r in zip(floors, at_c, strict=True)
        )
        # the floor's own process, Postgres and nats-server are metered (a smoke run's 30 tasks may take less
        # than one clock tick of any one of them, not of all of them in every round)
        assert all(set(f["run_cpu_s"]) == {"client", "postgres", "nats"} for f in floors), floors
        assert sum(sum(f["run_cpu_s"].values()) for f in floors) > 0, floors
        rate = figures[f"lifecycle.c{c}.vs_floor_tasks_per_s"]
        assert rate["beside"] == pytest.approx(statistics.median(f["tasks_per_s"] for f in floors), abs=0.1)
        cpu = figures[f"lifecycle.c{c}.vs_floor_cpu_ms_per_task"]
        assert cpu["beside"] == pytest.approx(statistics.median(f["cpu_ms_per_task"] for f in floors), abs=1e-3)
        # each side's processes, by CPU: devsched's scheduler and agent, the floor's client
        ours, _, floor = cpu["note"].removeprefix("devsched: ").partition("; the floor: ")
        assert {"scheduler", "agent"} <= {part.split(" ")[0] for part in ours.split(", ")}, cpu["note"]
        # each round runs an agent of its own (`agent bench-c16-r2`): the agent's figure is their median
        agents = [
            sum(s for name, s in r["devsched"]["run_cpu_s"].items() if name.startswith("agent "))
            * 1000
            / r["devsched"]["tasks"]
            for r in at_c
        ]
        (agent,) = [part for part in ours.removesuffix(" ms").split(", ") if part.startswith("agent ")]
        assert float(agent.split(" ")[1]) == pytest.approx(statistics.median(agents), abs=0.006), cpu["note"]
        assert "client" in {part.split(" ")[0] for part in floor.split(", ")}, cpu["note"]


def test_jetstream_messages_are_counted_per_task(document: dict[str, Any]) -> None:
    figures = {f["key"]: f for f in document["figures"]}
    for c in CONCURRENCY:
        runs = [r["devsched"] for r in document["details"]["lifecycle"]["runs"] if r["devsched"]["concurrency"] == c]
        # every task's assignment and its end are JetStream messages: a count below that missed a stream
        assert all(r["stream_messages_per_task"] >= 2 for r in runs), runs
        figure = figures[f"lifecycle.c{c}.stream_messages_per_task"]
        assert figure["value"] == pytest.approx(
            statistics.median(r["stream_messages_per_task"] for r in runs), abs=1e-3
        )


def test_each_renewal_figure_is_the_round_of_the_median_ratio(document: dict[str, Any]) -> None:
    renewals = document["details"]["renewals"]
    assert renewals["rounds"] == ROUNDS
    rounds = renewals["round_windows"]
    assert [r["round"] for r in rounds] == list(range(1, ROUNDS + 1))
    figures = {f["key"]: f for f in document["figures"]}
    rate = figures["renewals.per_s"]
    # each round's rate is rounded to 0.1 in the details; of two rounds, the lower ratio is the median's
    pairs = [(r["renew"]["rate_per_s"], r["floor"]["rate_per_s"]) for r in rounds]
    median_pair = min(pairs, key=lambda p: p[0] / p[1])
    assert rate["value"] == pytest.approx(median_pair[0], abs=0.1)
    assert rate["beside"] == pytest.approx(median_pair[1], abs=0.1)
    assert f"the median ratio of {ROUNDS} rounds" in rate["note"]


def test_each_batched_request_renews_its_hosts_leases(document: dict[str, Any]) -> None:
    batched = document["details"]["renewals"]["batched"]
    per = batched["leases_per_request"]
    assert (batched["hosts"], per) == (8, 8)
    rounds = batched["round_windows"]
    assert [r["round"] for r in rounds] == list(range(1, ROUNDS + 1))
    for load in [r[side] for r in rounds for side in ("devsched", "floor")]:
        assert load["requesters"] == batched["hosts"]
        assert load["requests"] > 0
        # counted from the replies, one outcome per lease: every lease of every request renewed
        assert load["leases_renewed"] == per * load["requests"], load
        assert load["leases_per_s"] == pytest.approx(per * load["rate_per_s"], abs=per * 0.1)
    assert batched["requests_total"] == sum(r["devsched"]["requests"] for r in rounds)
    assert batched["leases_renewed_total"] == per * batched["requests_total"]
    # the scheduler's side of the same count: one statement per request, returning each of its leases
    assert batched["renewals_statement"] == {
        "calls": batched["requests_total"],
        "rows": per * batched["requests_total"],
    }


def test_the_batched_cpu_per_lease_is_the_round_of_the_median_ratio_beside_the_per_lease_floor(
    document: dict[str, Any],
) -> None:
    renewals = document["details"]["renewals"]
    figure = {f["key"]: f for f in document["figures"]}["renewals.batched.server_cpu_ms_per_lease"]
    assert figure["goal"] == "<= 0.3x"
    pairs = []
    for batched, per_lease in zip(renewals["batched"]["round_windows"], renewals["round_windows"], strict=True):
        floor = per_lease["floor"]  # the per-lease floor of the same round: its server CPU per renewal
        pairs.append(
            (
                batched["devsched"]["server_cpu_ms_per_lease"],
                1000 * (floor["cpu_s"]["responder"] + floor["cpu_s"]["postgres"]) / floor["count"],
            )
        )
    # of two rounds, the lower ratio is the median's (the details round CPU seconds to 0.1 ms)
    value, beside = min(pairs, key=lambda p: p[0] / p[1] if p[1] else 0.0)
    assert figure["value"] == pytest.approx(value, abs=1e-3)
    assert figure["beside"] == pytest.approx(beside, rel=0.01, abs=1e-3)
    assert f"the median ratio of {ROUNDS} rounds" in figure["note"]


def test_goals_are_judged_from_the_figures(document: dict[str, Any]) -> None:
    judged = [f for f in document["figures"] if f["goal"] is not None]
    assert len(judged) >= 15
    for f in judged:
        if f["goal"].endswith("x"):  # a ratio goal: met when the ratio is on the right side of it
            threshold = float(f["goal"].split()[1].rstrip("x"))
            if f["ratio"] is not None:
                assert f["met"] == (f["ratio"] >= threshold if f["goal"].startswith(">=") else f["ratio"] <= threshold)
        else:
            threshold = float(f["goal"].split()[1])
            assert f["met"] == (f["value"] <= threshold), f
    counts = document["goals"]
    assert counts["met"] + counts["missed"] + counts["unjudged"] == len(judged)


def test_the_conditions_are_durable_and_said(document: dict[str, Any]) -> None:
    conditions = document["conditions"]
    settings = conditions["postgres"]["settings"]
    assert settings["fsync"] == "on"
    assert settings["synchronous_commit"] == "on"
    assert "pg_stat_statements" in settings["shared_preload_libraries"]
    assert conditions["postgres"]["filesystem"] not in ("tmpfs", "ramfs")
    assert not conditions["postgres"]["data_dir"].startswith("/dev/shm")
    assert conditions["nats"]["sync_interval"] == "always"
    assert conditions["machine"]["cpus"] >= 1
    assert conditions["packages"]["procrastinate"]
    # the lifecycle and the latency run at the scheduler's defaults; the saturation phases lift the fair share
    assert conditions["services"]["scheduler_settings"] == {}
    assert "DEVSCHED_HOST_RATE_PER_S" in conditions["services"]["saturation_settings"]


def test_the_report_prints_each_phase_and_the_data_is_gone(
    quick_run: tuple[subprocess.CompletedProcess[str], Path],
) -> None:
    result, _ = quick_run
    for title in ("lifecycle:", "lease renewals", "lease sweep", "scheduler memory", "single task"):
        assert title in result.stdout
    assert "fsync=on" in result.stdout
    (data_dir,) = re.findall(r"starting NATS and PostgreSQL \(durable\) in (\S+)", result.stdout)
    assert not Path(data_dir).exists()


def test_the_plot_is_a_png(quick_run: tuple[subprocess.CompletedProcess[str], Path]) -> None:
    _, out = quick_run
    png = (out / "bench.png").read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
    assert len(png) > 10_000


def test_the_profiles_hold_the_schedulers_and_the_agents_python_and_sql(
    quick_run: tuple[subprocess.CompletedProcess[str], Path],
) -> None:
    _, out = quick_run
    summary = (out / "profile" / "summary.md").read_text()
    assert "## scheduler-lifecycle-c16: the scheduler's Python" in summary
    assert "## scheduler-renewals: the scheduler's Python" in summary
    assert "## scheduler-renewals-batched: the scheduler's Python" in summary
    assert "## agent-lifecycle-c16: the agent's Python" in summary
    assert "--pid <agent>" in summary
    assert "samples at 100 Hz" in summary
    assert "--gil" in summary
    assert "## renewals: SQL" in summary
    assert "## renewals in batches of 8: SQL" in summary
    assert "## lifecycle c=16: run: SQL" in summary
    assert "## sweep: SQL" in summary
    assert "## sweep, renewals running: SQL" in summary
    assert "| by total (inclusive) |" in summary
