"""The conditions of a run, printed and kept beside its figures: versions, cores, disk, durability settings."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import subprocess
import time
from pathlib import Path
from typing import Any

from devsched.bench.pgstats import PgStats
from devsched.bench.servers import LIFTED_SHARE, BenchStack

#: Distributions whose versions a run records.
PACKAGES = (
    "devsched-scheduler", "devsched-sweeper", "devsched-agent", "devsched-store", "nats-py", "asyncpg",
    "sqlalchemy", "pydantic", "procrastinate", "psycopg", "matplotlib", "py-spy",
)  # fmt: skip
#: Postgres settings a run records.
PG_SETTINGS = (
    "fsync", "synchronous_commit", "full_page_writes", "wal_sync_method", "shared_buffers", "max_connections",
    "shared_preload_libraries",
)  # fmt: skip


def _version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
        if line.startswith("model name"):
            return line.partition(":")[2].strip()
    return platform.processor() or "unknown"


def _memory_gib() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) / 1024 / 1024
    return 0.0


def filesystem(path: Path) -> str:
    """The type of the filesystem `path` is on (`ext4`, `tmpfs`, ...), from /proc/mounts."""
    best, kind = "", "unknown"
    target = str(path.resolve())
    for line in Path("/proc/mounts").read_text().splitlines():
        parts = line.split()
        inside = len(parts) >= 3 and (target == parts[1] or target.startswith(parts[1].rstrip("/") + "/"))
        if inside and len(parts[1]) >= len(best):
            best, kind = parts[1], parts[2]
    return kind


def fdatasync_per_s(directory: Path, rounds: int = 200) -> float:
    """8 kB writes each followed by fdatasync per second in `directory`: what one durable commit costs."""
    path = directory / "fsync-probe"
    block = os.urandom(8192)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, block * 16)  # allocated first: overwrites, as WAL segments are
        os.fsync(fd)
        started = time.perf_counter()
        for i in range(rounds):
            os.pwrite(fd, block, (i % 16) * 8192)
            os.fdatasync(fd)
        return rounds / (time.perf_counter() - started)
    finally:
        os.close(fd)
        path.unlink(missing_ok=True)


def _nats_version(stack: BenchStack) -> str:
    result = subprocess.run([str(stack.nats.binary), "--version"], capture_output=True, text=True, check=False)
    return result.stdout.strip() or result.stderr.strip()


async def collect(stack: BenchStack, pg: PgStats, *, sync_always: bool) -> dict[str, Any]:
    """Everything the report's header says."""
    settings = await pg.show(*PG_SETTINGS)
    data = stack.postgres.data_dir
    return {
        "machine": {
            "cpus": os.cpu_count(),
            "cpu_model": _cpu_model(),
            "memory_gib": round(_memory_gib(), 1),
            "kernel": platform.release(),
            "python": platform.python_version(),
            "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
        },
        "postgres": {
            "version": await pg.version(),
            "settings": settings,
            "data_dir": str(data),
            "filesystem": filesystem(data),
            "fdatasync_8k_per_s": round(fdatasync_per_s(stack.data_dir)),
        },
        "nats": {
            "version": _nats_version(stack),
            "jetstream_store": str(stack.nats.store_dir),
            "filesystem": filesystem(stack.nats.store_dir),
            "sync_interval": "always" if sync_always else "default (2 min)",
        },
        "services": {
            "log_level": "INFO",
            "scheduler_settings": dict(stack.scheduler_env),
            "saturation_settings": dict(LIFTED_SHARE),
            "note": "every other setting at its default (db_pool_size 10 + 10 overflow, max_concurrency 64)",
        },
        "packages": {name: _version(name) for name in PACKAGES},
    }
