"""The PNG: throughput, CPU per task and latency distributions, with matplotlib (the `bench` group).

Throughput and CPU per task against concurrency, devsched beside Procrastinate; the latency distributions of
the renewals beside their floors, during a sweep, and of the single task.
"""

from __future__ import annotations

import importlib.util
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any


def available() -> bool:
    """Whether matplotlib is installed."""
    return importlib.util.find_spec("matplotlib") is not None


def _series(runs: Sequence[Mapping[str, Any]], side: str, key: str) -> tuple[list[int], list[float]]:
    """`key` of `side` against concurrency: the median of the rounds at each c, as the figures are."""
    at: dict[int, list[float]] = {}
    for run in runs:
        part = run.get(side)
        if part:
            at.setdefault(int(part["concurrency"]), []).append(float(part[key]))
    xs = sorted(at)
    return xs, [float(statistics.median(at[x])) for x in xs]


def draw(path: Path, details: Mapping[str, Any], samples: Mapping[str, Sequence[float]], title: str) -> None:
    """Write the plot to `path` (PNG).

    Raises:
        ModuleNotFoundError: matplotlib is not installed.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (throughput, cpu, latency) = plt.subplots(1, 3, figsize=(17, 5.2))
    runs = details.get("lifecycle", {}).get("runs", [])
    peer = str(details.get("lifecycle", {}).get("peer", "peer"))
    for axis, (ours, theirs, label) in (
        (throughput, ("tasks_per_s", "jobs_per_s", "tasks (jobs) per second")),
        (cpu, ("cpu_ms_per_task", "cpu_ms_per_job", "CPU ms per task (job), all processes")),
    ):
        xs, ys = _series(runs, "devsched", ours)
        axis.plot(xs, ys, "o-", label="devsched")
        pxs, pys = _series(runs, "peer", theirs)
        if pxs:
            axis.plot(pxs, pys, "s--", label=peer)
        axis.set_xscale("log", base=2)
        axis.set_xticks(xs or [1], [str(x) for x in (xs or [1])])
        axis.set_xlabel("concurrency c (agent devices / worker concurrency)")
        axis.set_ylabel(label)
        axis.set_ylim(bottom=0)
        axis.grid(True, alpha=0.3)
        axis.legend()
    throughput.set_title("lifecycle throughput")
    cpu.set_title("lifecycle CPU per task")

    for name, values in samples.items():
        if not values:
            continue
        ordered = sorted(values)
        n = len(ordered)
        latency.plot(ordered, [(i + 1) / n for i in range(n)], label=f"{name} (n={n})")
    latency.set_xscale("log")
    latency.set_xlabel("latency, ms (log)")
    latency.set_ylabel("fraction of requests at or below")
    latency.set_title("latency distributions")
    latency.grid(True, alpha=0.3)
    latency.legend(fontsize=7, loc="lower right")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
