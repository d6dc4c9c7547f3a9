"""A journal that the steps themselves write: when each step of each attempt started and ended, on which device.

The agent's own logs say what it meant to do; the journal says what ran. Each journaled step is a `shell` step
that appends `start` and `end` lines with the kernel's boot clock (`/proc/uptime`: neither libfaketime nor a
wall-clock jump changes it) and holds a lock on its device's lock file while it runs: a step that finds the lock
taken writes an `overlap` line, so two attempts running on one device at once are caught by the kernel, not by
comparing timestamps. The invariant checker (`support.invariants`) reads it.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

#: Resolution of /proc/uptime (10 ms) plus the error of converting it to the wall clock.
CLOCK_SLACK_S = 0.05


def boot_seconds() -> float:
    """Seconds since boot, read as the steps read them."""
    return float(Path("/proc/uptime").read_text().split()[0])


@dataclass(frozen=True)
class Entry:
    """One line of the journal."""

    kind: str  # start | end | overlap
    task_id: str
    attempt: int
    device_id: str
    step: str
    at: datetime | None  # wall-clock time (from the boot clock); None for `overlap`


@dataclass(frozen=True)
class Run:
    """One step of one attempt as it ran: its start, and its end unless it was killed first."""

    task_id: str
    attempt: int
    device_id: str
    step: str
    started: datetime
    ended: datetime | None


class StepJournal:
    """The journal file and device lock files of one test, under `directory`."""

    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.directory = directory
        self.path = directory / "steps.journal"
        self.path.touch()

    def step(self, name: str, seconds: float = 0.2, **options: Any) -> dict[str, Any]:
        """A `shell` step that journals its run and lasts about `seconds` (options: `interruptible`, ...)."""
        journal, locks = str(self.path), str(self.directory)
        ids = f'"$DEVSCHED_TASK_ID" "$DEVSCHED_ATTEMPT" "$DEVSCHED_DEVICE_ID" {name}'
        command = (
            f'exec 9>>"{locks}/lock-$DEVSCHED_DEVICE_ID"; '
            f'flock -n 9 || echo overlap {ids} >> "{journal}"; '
            f'read up _ < /proc/uptime; echo start {ids} "$up" >> "{journal}"; '
            f"sleep {seconds}; "
            f'read up _ < /proc/uptime; echo end {ids} "$up" >> "{journal}"'
        )
        return {"name": name, "action": "shell", "args": {"command": command}, **options}

    def plan(self, *seconds: float) -> list[dict[str, Any]]:
        """Journaled steps `s1`, `s2`, ... lasting these seconds each."""
        return [self.step(f"s{i}", s) for i, s in enumerate(seconds, 1)]

    def entries(self) -> list[Entry]:
        """Every complete line written so far, boot-clock times converted to the wall clock."""
        offset = time.time() - boot_seconds()
        found = []
        for line in self.path.read_text().splitlines():
            parts = line.split()
            if len(parts) < 5 or parts[0] not in ("start", "end", "overlap"):
                continue
            at = None
            if parts[0] != "overlap":
                if len(parts) != 6:
                    continue
                at = datetime.fromtimestamp(offset + float(parts[5]), UTC)
            found.append(Entry(parts[0], parts[1], int(parts[2]), parts[3], parts[4], at))
        return found

    def runs(self) -> list[Run]:
        """Each started step with its end, if it wrote one."""
        starts: dict[tuple[str, int, str], Entry] = {}
        ends: dict[tuple[str, int, str], datetime] = {}
        for e in self.entries():
            key = (e.task_id, e.attempt, e.step)
            if e.kind == "start" and e.at is not None:
                starts[key] = e
            elif e.kind == "end" and e.at is not None:
                ends[key] = e.at
        return [
            Run(s.task_id, s.attempt, s.device_id, s.step, s.at, ends.get(key))
            for key, s in starts.items()
            if s.at is not None
        ]

    def overlaps(self) -> list[Entry]:
        """Steps that found their device's lock taken by another step."""
        return [e for e in self.entries() if e.kind == "overlap"]

    def starts_of(self, task_id: str) -> dict[int, list[str]]:
        """The steps each attempt of `task_id` started, in order."""
        found: dict[int, list[str]] = defaultdict(list)
        for e in self.entries():
            if e.kind == "start" and e.task_id == task_id:
                found[e.attempt].append(e.step)
        return dict(found)


def slack() -> timedelta:
    """`CLOCK_SLACK_S` as a timedelta."""
    return timedelta(seconds=CLOCK_SLACK_S)
