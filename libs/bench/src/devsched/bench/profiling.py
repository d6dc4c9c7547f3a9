"""Profiles of the scheduler under a phase's load: py-spy's samples of its Python, pg_stat_statements' SQL.

`devsched bench --profile DIR` attaches `py-spy record --gil --nonblocking` to the scheduler while the
lifecycle at the highest concurrency and the renewal window run, keeps the raw collapsed stacks, and writes
a summary: the functions by total (inclusive) and self time, and the statements by total time with their
calls per task or per renewal. `--nonblocking` does not pause the process (the load is not slowed by the
sampling); `--gil` keeps only the samples where the scheduler holds the GIL, i.e. runs Python: time in
system calls (socket writes, which hand the data to the receiving process) and waiting for a CPU on a
busy machine are left out, and the process's CPU time from /proc is printed beside for the whole.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import sysconfig
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from devsched.bench.pgstats import Statement

#: Samples per second.
RATE_HZ = 100
#: How py-spy records (see the module's docstring).
PY_SPY_FLAGS = ("--rate", str(RATE_HZ), "--format", "raw", "--nolineno", "--gil", "--nonblocking")


def py_spy_binary() -> str | None:
    """The py-spy executable of this environment (the `bench` group), or None."""
    for directory in (sysconfig.get_path("scripts"), str(Path(sys.executable).parent)):
        found = shutil.which("py-spy", path=directory)
        if found:
            return found
    return shutil.which("py-spy")


class PySpy:
    """`py-spy record` of one process into a raw (collapsed stacks) file, from `start()` to `stop()`."""

    def __init__(self, pid: int, output: Path) -> None:
        self.pid = pid
        self.output = output
        self.proc: subprocess.Popen[bytes] | None = None
        self.error = ""

    def start(self) -> bool:
        """Start sampling; False (and `error` says why) when py-spy is missing or cannot attach."""
        binary = py_spy_binary()
        if binary is None:
            self.error = "py-spy is not installed (the bench group)"
            return False
        self.output.parent.mkdir(parents=True, exist_ok=True)
        argv = [binary, "record", *PY_SPY_FLAGS, "--pid", str(self.pid), "--output", str(self.output)]
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        return True

    def stop(self) -> bool:
        """Stop (SIGINT makes py-spy write its file); True when the file is there."""
        if self.proc is None:
            return False
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        try:
            _, err = self.proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            _, err = self.proc.communicate()
        if not self.output.exists():
            self.error = err.decode(errors="replace").strip()[-500:]
            return False
        return True


@dataclass(frozen=True, slots=True)
class FunctionTime:
    """One function's share of the samples."""

    function: str
    total: int
    """Samples with the function anywhere on the stack."""
    own: int
    """Samples with the function on top."""


def read_stacks(path: Path) -> Counter[tuple[str, ...]]:
    """The collapsed stacks of a raw py-spy file: stack (outermost first) -> samples."""
    stacks: Counter[tuple[str, ...]] = Counter()
    for line in path.read_text(errors="replace").splitlines():
        frames, _, count = line.rpartition(" ")
        if frames and count.isdigit():
            stacks[tuple(frames.split(";"))] += int(count)
    return stacks


#: Frames under which everything runs (the event loop, the entry point): left out of the table by total time.
PLUMBING = (
    "(asyncio/runners.py)", "(asyncio/base_events.py)", "(asyncio/events.py)", "(<frozen runpy>)", "__main__.py)",
    "(service/lifecycle.py)", "(scheduler/main.py)", "(sweeper/main.py)",
)  # fmt: skip


def top_functions(stacks: Counter[tuple[str, ...]], limit: int) -> tuple[int, list[FunctionTime], list[FunctionTime]]:
    """(all samples, the top `limit` by total but for the PLUMBING, the top `limit` by own samples)."""
    total: Counter[str] = Counter()
    own: Counter[str] = Counter()
    for stack, count in stacks.items():
        for frame in set(stack):
            total[frame] += count
        own[stack[-1]] += count
    everything = sum(stacks.values())

    by_total = [f for f, _ in total.most_common() if not f.endswith(PLUMBING)][:limit]
    return (
        everything,
        [FunctionTime(f, total[f], own[f]) for f in by_total],
        [FunctionTime(f, total[f], own[f]) for f, _ in own.most_common(limit)],
    )


def python_table(path: Path, *, per: int, what: str, cpu_s: float, limit: int = 15) -> str:
    """A Markdown summary of a raw profile: the process's time per `what` and the top functions.

    `cpu_s` is the process's CPU time over the same load, from /proc (Python, the C libraries and the
    kernel's work on its behalf): the samples only count the time it held the GIL.
    """
    samples, by_total, by_own = top_functions(read_stacks(path), limit)
    seconds = samples / RATE_HZ
    lines = [
        f"{samples} samples at {RATE_HZ} Hz = {seconds:.2f} s holding the GIL = {1000 * seconds / max(per, 1):.3f}"
        f" ms per {what} ({per} {what}s); its CPU time (/proc) was {1000 * cpu_s / max(per, 1):.3f} ms"
        f" per {what}",
        "",
        f"| by total (inclusive) | total % | self % | total ms/{what} |",
        "| --- | ---: | ---: | ---: |",
    ]
    for row in by_total:
        lines.append(_row(row, samples, per))
    lines += ["", f"| by self | self % | total % | self ms/{what} |", "| --- | ---: | ---: | ---: |"]
    for row in by_own:
        share = 1000 * row.own / RATE_HZ / max(per, 1)
        lines.append(
            f"| `{row.function}` | {100 * row.own / max(samples, 1):.1f} | {100 * row.total / max(samples, 1):.1f}"
            f" | {share:.3f} |"
        )
    return "\n".join(lines)


def _row(row: FunctionTime, samples: int, per: int) -> str:
    share = 1000 * row.total / RATE_HZ / max(per, 1)
    return (
        f"| `{row.function}` | {100 * row.total / max(samples, 1):.1f} | {100 * row.own / max(samples, 1):.1f}"
        f" | {share:.3f} |"
    )


def sql_table(statements: list[Statement], *, per: int, what: str, limit: int = 15) -> str:
    """A Markdown table of the statements by total time, with calls and ms per `what`."""
    calls = sum(s.calls for s in statements)
    total_ms = sum(s.total_ms for s in statements)
    lines = [
        f"{calls} statements, {total_ms:.1f} ms in the server, for {per} {what}s:"
        f" {calls / max(per, 1):.2f} statements and {total_ms / max(per, 1):.3f} ms per {what}",
        "",
        f"| statement | calls/{what} | total ms | ms/{what} | mean ms | rows/call |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for s in statements[:limit]:
        query = " ".join(s.query.split())
        if len(query) > 160:
            query = query[:157] + "..."
        lines.append(
            f"| `{query}` | {s.calls / max(per, 1):.2f} | {s.total_ms:.1f} | {s.total_ms / max(per, 1):.3f}"
            f" | {s.total_ms / max(s.calls, 1):.3f} | {s.rows / max(s.calls, 1):.1f} |"
        )
    return "\n".join(lines)


def statement_summary(statements: list[Statement], per: int, limit: int = 15) -> dict[str, Any]:
    """For the JSON output: counts per unit of work and the top statements by total time."""
    calls = sum(s.calls for s in statements)
    return {
        "statements_per_unit": round(calls / max(per, 1), 3),
        "server_ms_per_unit": round(sum(s.total_ms for s in statements) / max(per, 1), 4),
        "top": [{**s.as_dict(), "calls_per_unit": round(s.calls / max(per, 1), 3)} for s in statements[:limit]],
    }
