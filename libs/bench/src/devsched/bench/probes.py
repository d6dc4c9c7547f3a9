"""What the bench reads off the machine: CPU time of process trees, memory, latency distributions.

CPU comes from `/proc/<pid>/stat` (utime + stime), summed over a process and every descendant, plus the
children each of them has already reaped (cutime + cstime): Postgres forks a backend per connection and
the postmaster reaps the ones that end, so the tree's total stays right across a backend's exit, and so
does a delta taken over a phase. Only this machine's other processes (other users' load) are left out.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

#: Clock ticks per second of the utime/stime fields.
_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True, slots=True)
class _Proc:
    ppid: int
    cpu_s: float  # own and reaped children's user + system time


def _processes() -> dict[int, _Proc]:
    table: dict[int, _Proc] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # gone since the listing
            continue
        # after the parenthesised command name: state ppid pgrp session tty tpgid flags minflt cminflt
        # majflt cmajflt utime stime cutime cstime ...
        fields = stat.rsplit(")", 1)[-1].split()
        ticks = int(fields[11]) + int(fields[12]) + int(fields[13]) + int(fields[14])
        table[int(entry.name)] = _Proc(int(fields[1]), ticks / _TICKS)
    return table


def _tree(pid: int, children: Mapping[int, list[int]]) -> list[int]:
    found, todo = [pid], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def cpu_seconds(roots: Mapping[str, int | None]) -> dict[str, float]:
    """CPU seconds used so far by each named process tree (0 for a root that is not running)."""
    table = _processes()
    children: dict[int, list[int]] = {}
    for pid, proc in table.items():
        children.setdefault(proc.ppid, []).append(pid)
    out: dict[str, float] = {}
    for name, root in roots.items():
        if root is None or root not in table:
            out[name] = 0.0
            continue
        out[name] = sum(table[p].cpu_s for p in _tree(root, children) if p in table)
    return out


class CpuMeter:
    """CPU seconds of named process trees between `start()` and `stop()`.

    Args:
        roots: name -> pid of each tree (`scheduler`, `postgres`, ...), read at each snapshot, so a pid
            may change between phases (a restarted agent).
    """

    def __init__(self, roots: Mapping[str, int | None]) -> None:
        self.roots = dict(roots)
        self._before: dict[str, float] = {}
        self.used: dict[str, float] = {}

    def start(self) -> None:
        """Take the first snapshot."""
        self._before = cpu_seconds(self.roots)

    def stop(self) -> dict[str, float]:
        """Take the second snapshot; returns (and keeps in `used`) the seconds each tree used since `start`."""
        after = cpu_seconds(self.roots)
        self.used = {name: max(0.0, after[name] - self._before.get(name, 0.0)) for name in self.roots}
        return self.used

    def total(self, names: Iterable[str] | None = None) -> float:
        """Seconds used by `names` (every tree by default)."""
        wanted = self.used.keys() if names is None else names
        return sum(self.used.get(name, 0.0) for name in wanted)


def memory_kib(pid: int) -> dict[str, int]:
    """`VmRSS` and `VmHWM` (peak RSS) of `pid`, in KiB, from `/proc/<pid>/status`."""
    out: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(value.split()[0])
    return out


@dataclass(frozen=True, slots=True)
class Distribution:
    """A latency distribution in milliseconds: count, mean and the quantiles the report prints."""

    count: int
    mean_ms: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    max_ms: float

    @classmethod
    def of(cls, samples_ms: Sequence[float]) -> Distribution:
        """The distribution of `samples_ms` (all zeros when empty)."""
        if not samples_ms:
            return cls(0, 0.0, 0.0, 0.0, 0.0, 0.0)
        if len(samples_ms) == 1:
            only = samples_ms[0]
            return cls(1, only, only, only, only, only)
        cuts = statistics.quantiles(samples_ms, n=100, method="inclusive")
        return cls(len(samples_ms), statistics.fmean(samples_ms), cuts[49], cuts[89], cuts[98], max(samples_ms))

    def as_dict(self) -> dict[str, float]:
        """For the JSON output (rounded to microseconds)."""
        return {
            "count": self.count,
            "mean_ms": round(self.mean_ms, 3),
            "p50_ms": round(self.p50_ms, 3),
            "p90_ms": round(self.p90_ms, 3),
            "p99_ms": round(self.p99_ms, 3),
            "max_ms": round(self.max_ms, 3),
        }
