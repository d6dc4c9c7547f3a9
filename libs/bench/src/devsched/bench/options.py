"""What `devsched bench` can be told, and the sizes of a full and of a `--quick` run."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

#: The phases, in the order they run (each leaves the next a clean system; see runner.py).
PHASES = ("lifecycle", "latency", "renewals", "sweep", "memory")


@dataclass(frozen=True, slots=True)
class Sizes:
    """How much work each phase does."""

    tasks: int
    """Tasks per lifecycle run (and jobs per Procrastinate run)."""
    window_s: float
    """Measured seconds of each closed-loop load (echo, UPDATE, renewals)."""
    warmup_s: float
    """Unmeasured seconds before each window."""
    latency_tasks: int
    """Tasks of the single-task latency figure, one at a time."""
    leases: int
    """Expired leases of the sweep figure."""
    queued: tuple[int, int]
    """Queue depths at which the scheduler's memory is read."""
    settle_s: float
    """Wait after a phase before reading pg_stat_database: an idle backend reports its counts within 10 s."""
    rounds: int
    """Lifecycle runs at each concurrency, devsched's and the peer's in turn, and renewal windows, devsched's
    and the floor's in turn; each of their figures is the median of its rounds."""


FULL = Sizes(
    tasks=1000,
    window_s=8.0,
    warmup_s=2.0,
    latency_tasks=40,
    leases=10_000,
    queued=(1_000, 100_000),
    settle_s=10.5,
    rounds=3,
)
QUICK = Sizes(
    tasks=30,
    window_s=1.0,
    warmup_s=0.3,
    latency_tasks=4,
    leases=200,
    queued=(100, 1_000),
    settle_s=0.5,
    rounds=1,
)

#: The renewal load: concurrent requesters, over hosts of this many devices each (one connection per host).
REQUESTERS = 64
DEVICES_PER_HOST = 8


@dataclass(frozen=True, slots=True)
class BenchOptions:
    """Everything `devsched bench` can be told (see `devsched bench --help`)."""

    sizes: Sizes = FULL
    quick: bool = False
    concurrency: tuple[int, ...] = (1, 4, 16)
    only: tuple[str, ...] = PHASES
    json_path: Path | None = None
    plot_path: Path | None = None
    profile_dir: Path | None = None
    """py-spy profiles of the scheduler and the agent, and pg_stat_statements', go here (none when unset)."""
    data_dir: Path | None = None
    """Where the servers keep their data; a fresh directory under /var/tmp (on disk) by default."""
    keep_data: bool = False
    nats_sync_always: bool = True
    """JetStream `sync_interval: always` (every write fsync'd, as production should run it)."""
    peer: bool = True
    """Run Procrastinate beside the lifecycle figures when it is installed."""
    extra: dict[str, str] = field(default_factory=dict)
    """Environment given to the scheduler on top of the bench's (DEVSCHED_* settings)."""
