from __future__ import annotations

import os
import subprocess
from typing import Any

import pytest

from devsched.agent.procfs import boot_id, group_members, parse_stat, processes, read_stat
from support.polling import eventually

pytestmark = pytest.mark.unit


def spawn(argv: list[str], **options: Any) -> subprocess.Popen[bytes]:
    """A child that asyncio does not reap: the test decides when it is waited for."""
    return subprocess.Popen(argv, **options)


def test_a_name_with_spaces_and_parentheses_does_not_shift_the_fields() -> None:
    rest = " ".join(str(n) for n in range(7, 60))  # fields 7 onwards hold their own number
    line = f"42 (a) b (c) S 7 42 42 {rest}".encode()
    stat = parse_stat(42, line)
    assert (stat.pid, stat.state, stat.ppid, stat.pgid, stat.session) == (42, "S", 7, 42, 42)
    assert stat.start_time == 22  # field 22 of stat(5), counted from the pid
    assert stat.alive


def test_a_truncated_line_is_refused() -> None:
    with pytest.raises(ValueError, match="fields"):
        parse_stat(1, b"1 (init) S 0 1 1")


def test_this_process_as_proc_shows_it() -> None:
    stat = read_stat(os.getpid())
    assert stat is not None
    assert (stat.pid, stat.ppid, stat.pgid, stat.session) == (os.getpid(), os.getppid(), os.getpgid(0), os.getsid(0))
    assert stat.alive
    again = read_stat(os.getpid())
    assert again is not None
    assert again.start_time == stat.start_time  # what names the process across time
    assert any(p.pid == os.getpid() for p in processes())


async def test_a_zombie_is_not_alive_and_a_reaped_process_is_gone() -> None:
    child = spawn(["true"])
    try:
        # Exited but not yet reaped (no `wait` yet): a zombie.
        zombie = await eventually(
            lambda: (stat := read_stat(child.pid)) is not None and not stat.alive and stat, message="zombie"
        )
    finally:
        child.wait()
    after = read_stat(child.pid)
    assert after is None or after.start_time != zombie.start_time


async def test_group_members_are_the_live_processes_of_the_group() -> None:
    leader = spawn(["sh", "-c", "sleep 60 & exec sleep 60"], start_new_session=True)
    try:
        members = await eventually(lambda: len(m := group_members(leader.pid)) == 2 and m, message="two members")
        assert [m.pgid for m in members] == [leader.pid, leader.pid]
        assert leader.pid in {m.pid for m in members}
    finally:
        os.killpg(leader.pid, 9)
        leader.wait()


def test_the_boot_has_an_id() -> None:
    assert boot_id()
