"""Processes as /proc shows them: state, group, session and start time, the identity that outlives a pid.

A pid is reused once its process is gone, so a pid alone does not name a process across time; the pid
with its start time (clock ticks since boot, field 22 of `/proc/<pid>/stat`) and the boot id does.

The functions read small files; a scan of every process is a few milliseconds on a busy host.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

PROC = "/proc"
_BOOT_ID = "/proc/sys/kernel/random/boot_id"
#: States of a process that has exited: it holds nothing but its pid, until its parent reaps it.
_DEAD_STATES = frozenset({"Z", "X"})


@dataclass(frozen=True, slots=True)
class ProcStat:
    """What `/proc/<pid>/stat` says about one process."""

    pid: int
    state: str
    ppid: int
    pgid: int
    session: int
    #: When it started, in clock ticks since boot: with the pid, it names the process.
    start_time: int

    @property
    def alive(self) -> bool:
        """Whether it still runs (a zombie does not)."""
        return self.state not in _DEAD_STATES


def parse_stat(pid: int, text: bytes) -> ProcStat:
    """Parse the content of `/proc/<pid>/stat`.

    Raises:
        ValueError: it is not a stat line.
    """
    # "pid (comm) state ppid pgrp session ... starttime ...": comm may hold spaces and parentheses, so the
    # fields are counted after the last ")".
    fields = text[text.rfind(b")") + 2 :].split()
    if len(fields) < 20:
        raise ValueError(f"/proc/{pid}/stat has {len(fields)} fields after the name")
    return ProcStat(
        pid=pid,
        state=fields[0].decode("ascii", "replace"),
        ppid=int(fields[1]),
        pgid=int(fields[2]),
        session=int(fields[3]),
        start_time=int(fields[19]),
    )


def read_stat(pid: int, proc: str = PROC) -> ProcStat | None:
    """The process `pid`, or None when there is none (or /proc is not there)."""
    try:
        with open(f"{proc}/{pid}/stat", "rb") as handle:
            text = handle.read()
    except OSError:  # gone, or never was
        return None
    try:
        return parse_stat(pid, text)
    except ValueError:
        return None


def processes(proc: str = PROC) -> Iterator[ProcStat]:
    """Every process /proc lists (those that exit meanwhile are left out)."""
    try:
        entries = os.scandir(proc)
    except OSError:
        return
    with entries:
        for entry in entries:
            if entry.name.isdigit():
                stat = read_stat(int(entry.name), proc)
                if stat is not None:
                    yield stat


def group_members(pgid: int, proc: str = PROC) -> list[ProcStat]:
    """The live (not zombie) processes of process group `pgid`."""
    return [p for p in processes(proc) if p.pgid == pgid and p.alive]


def boot_id() -> str | None:
    """This boot's id: start times count from the boot, so they compare only within one."""
    try:
        return Path(_BOOT_ID).read_text().strip() or None
    except OSError:
        return None


def has_proc(proc: str = PROC) -> bool:
    """Whether /proc is there to read (Linux)."""
    return os.path.isdir(proc)
