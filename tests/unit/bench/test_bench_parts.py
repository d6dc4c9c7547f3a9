"""The bench's own arithmetic: goals and ratios, latency quantiles, CPU of process trees, profile summaries."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from devsched.bench.figures import Figure, at_least, at_most, value_at_most
from devsched.bench.probes import CpuMeter, Distribution, cpu_seconds, memory_kib
from devsched.bench.profiling import python_table, read_stacks, top_functions
from devsched.bench.report import goal_summary, render_figures

pytestmark = pytest.mark.unit


def test_a_ratio_goal_is_judged_on_value_over_beside() -> None:
    fast = Figure("lifecycle.c16.tasks_per_s", "tasks/s", "tasks/s", 300.0, 100.0, "peer", at_least(2.0))
    slow = Figure("lifecycle.c16.tasks_per_s", "tasks/s", "tasks/s", 150.0, 100.0, "peer", at_least(2.0))
    assert fast.ratio == 3.0
    assert fast.met is True
    assert slow.met is False
    cheap = Figure("renewals.server_cpu_ms", "cpu", "ms", 0.5, 0.4, "floor", at_most(1.5))
    assert cheap.met is True
    assert str(at_least(2.0)) == ">= 2x"
    assert str(value_at_most(150)) == "<= 150"


def test_a_figure_without_what_it_is_beside_has_no_ratio_and_an_unjudged_ratio_goal() -> None:
    alone = Figure("lifecycle.c1.tasks_per_s", "tasks/s", "tasks/s", 50.0, None, None, at_least(1.0), "not installed")
    assert alone.ratio is None
    assert alone.met is None
    capped = Figure("memory.rss_mb_deep", "rss", "MB", 151.0, goal=value_at_most(150))
    assert capped.met is False
    assert goal_summary([alone, capped]) == {"met": 0, "missed": 1, "unjudged": 1}
    text = render_figures([alone, capped])
    assert "not installed" in text
    assert "MISSED" in text


def test_distribution_quantiles() -> None:
    dist = Distribution.of([float(i) for i in range(1, 101)])
    assert dist.count == 100
    assert dist.p50_ms == pytest.approx(50.5)
    assert dist.p99_ms == pytest.approx(99.01)
    assert dist.max_ms == 100
    assert Distribution.of([]).count == 0
    assert Distribution.of([3.0]).p99_ms == 3.0


def test_cpu_of_a_tree_counts_a_child_after_it_ended(tmp_path: Path) -> None:
    """A busy grandchild that exits is reaped by its parent: the tree's CPU keeps its time."""
    burn = "import time\nend = time.process_time() + 0.3\nwhile time.process_time() < end: pass\n"
    script = f"import subprocess, sys, time; subprocess.run([sys.executable, '-c', {burn!r}]); time.sleep(30)"
    parent = subprocess.Popen([sys.executable, "-c", script])
    try:
        meter = CpuMeter({"tree": parent.pid, "nothing": None})
        meter.start()
        deadline = time.monotonic() + 20
        while meter.stop()["tree"] < 0.25 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert meter.used["tree"] >= 0.25
        assert meter.used["nothing"] == 0.0
    finally:
        parent.kill()
        parent.wait()
    assert cpu_seconds({"me": os.getpid()})["me"] > 0
    assert memory_kib(os.getpid())["VmRSS"] > 0


def test_profile_summary_ranks_functions_and_leaves_out_the_event_loop(tmp_path: Path) -> None:
    raw = tmp_path / "p.raw"
    loop = "run (asyncio/runners.py);_run_once (asyncio/base_events.py)"
    raw.write_text(
        f"{loop};handle (scheduler/api.py);execute (asyncpg/connection.py) 60\n"
        f"{loop};handle (scheduler/api.py);dumps (json/__init__.py) 30\n"
        f"{loop};relay (scheduler/relay.py) 10\n"
    )
    stacks = read_stacks(raw)
    assert stacks == Counter(
        {
            ("run (asyncio/runners.py)", "_run_once (asyncio/base_events.py)", "handle (scheduler/api.py)",
             "execute (asyncpg/connection.py)"): 60,
            ("run (asyncio/runners.py)", "_run_once (asyncio/base_events.py)", "handle (scheduler/api.py)",
             "dumps (json/__init__.py)"): 30,
            ("run (asyncio/runners.py)", "_run_once (asyncio/base_events.py)", "relay (scheduler/relay.py)"): 10,
        }
    )  # fmt: skip
    samples, by_total, by_own = top_functions(stacks, 3)
    assert samples == 100
    assert [(f.function, f.total) for f in by_total] == [
        ("handle (scheduler/api.py)", 90),
        ("execute (asyncpg/connection.py)", 60),
        ("dumps (json/__init__.py)", 30),
    ]
    assert (by_own[0].function, by_own[0].own) == ("execute (asyncpg/connection.py)", 60)
    table = python_table(raw, per=50, what="task", cpu_s=0.5)
    assert "= 20.000 ms per task (50 tasks)" in table
    assert "was 10.000 ms per task" in table
    assert "holding the GIL" in table
