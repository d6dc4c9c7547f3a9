"""No orphans: steps die with the process that started them, and the sweep ends what they left, nothing else.

Every process here is real: groups are started with `start_new_session` as the shell action starts them,
and the sweep reads the real /proc.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import pwd
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from devsched.agent.orphans import GroupRecord, StepGroups
from devsched.agent.procfs import boot_id, read_stat
from devsched.agent.spool import Records, Spool
from support.polling import eventually, throughout

from .helpers import IDENTITY, process_running, read_pid

pytestmark = pytest.mark.unit


@pytest.fixture
def records(tmp_path: Path) -> Iterator[Records]:
    spool = Spool(tmp_path / "spool")
    spool.lock()
    yield spool.records("groups")
    spool.unlock()


@pytest.fixture
def started() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Processes a test starts (each the leader of its own group); their groups are killed after it."""
    processes: list[subprocess.Popen[bytes]] = []
    yield processes
    for process in processes:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        for pipe in (process.stdin, process.stdout):
            if pipe is not None:
                pipe.close()


def leader(started: list[subprocess.Popen[bytes]], command: str = "exec sleep 60") -> subprocess.Popen[bytes]:
    """A shell in a session and group of its own, as a step's."""
    process = subprocess.Popen(
        ["/bin/sh", "-c", command], start_new_session=True, stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    started.append(process)
    return process


async def gone(pid: int) -> None:
    await eventually(lambda: not process_running(pid), timeout=10, message=f"process {pid} gone")


async def test_a_group_is_recorded_with_its_leader_and_attempt_and_forgotten(
    records: Records, started: list[subprocess.Popen[bytes]]
) -> None:
    process = leader(started)
    groups = StepGroups(records)
    await groups.record(process.pid, IDENTITY)
    [(key, body)] = records.items()
    stat = read_stat(process.pid)
    assert stat is not None
    assert key == f"{process.pid}.{stat.start_time}"
    record = GroupRecord.decode(body)
    assert (record.pgid, record.session, record.start_time) == (process.pid, process.pid, stat.start_time)
    assert (record.task_id, record.attempt, record.lease_id, record.device_id) == ("task-1", 2, "lease-3", "dev-4")
    assert record.boot_id
    await groups.forget(process.pid)
    assert records.items() == []


async def test_the_sweep_kills_a_recorded_group_whose_leader_still_runs(
    records: Records, started: list[subprocess.Popen[bytes]]
) -> None:
    process = leader(started, "sleep 60 & echo $!; exec sleep 60")
    assert process.stdout is not None
    child = int(process.stdout.readline())
    await StepGroups(records).record(process.pid, IDENTITY)
    killed = StepGroups(records).sweep()  # a new agent: a ledger of its own over the same spool
    assert [(r.pgid, r.task_id, r.attempt) for r in killed] == [(process.pid, "task-1", 2)]
    await gone(child)
    assert process.wait(timeout=10) == -signal.SIGKILL
    assert records.items() == []


async def test_the_sweep_kills_what_is_left_of_a_group_whose_leader_died(
    records: Records, started: list[subprocess.Popen[bytes]]
) -> None:
    # What the parent-death signal leaves: the leader killed, its child still running in its group.
    process = leader(started, "sleep 60 & echo $!; read -r _")
    assert process.stdout is not None
    assert process.stdin is not None
    child = int(process.stdout.readline())
    await StepGroups(records).record(process.pid, IDENTITY)
    process.stdin.close()  # the leader reads EOF and exits
    process.wait(timeout=10)
    assert process_running(child)
    [killed] = StepGroups(records).sweep()
    assert killed.pgid == process.pid
    await gone(child)
    assert records.items() == []


def _recorded(process: subprocess.Popen[bytes]) -> GroupRecord:
    """The record of the group that `process` leads, as `StepGroups.record` writes it."""
    stat = read_stat(process.pid)
    assert stat is not None
    body = {
        "pgid": process.pid,
        "session": stat.session,
        "start_time": stat.start_time,
        "boot_id": boot_id(),
        "task_id": "task-1",
        "attempt": 2,
        "lease_id": "lease-3",
        "device_id": "dev-4",
    }
    return GroupRecord.decode(json.dumps(body).encode())


@pytest.mark.parametrize(
    ("what", "differ"),
    [
        # The recorded leader started earlier: its group died out and the pid went to this unrelated process.
        ("a pid reused by an unrelated process", lambda r: dataclasses.replace(r, start_time=r.start_time - 1)),
        # Start times count from the boot: a record of another boot names nothing of this one.
        ("a record of another boot", lambda r: dataclasses.replace(r, boot_id="another-boot")),
        # The recorded group's members are all in the recorded session.
        ("a group of another session", lambda r: dataclasses.replace(r, session=1)),
    ],
)
async def test_a_process_whose_identity_differs_from_the_record_is_never_killed(
    records: Records,
    started: list[subprocess.Popen[bytes]],
    what: str,
    differ: Callable[[GroupRecord], GroupRecord],
) -> None:
    process = leader(started)
    record = differ(_recorded(process))
    records.put(record.key, record.encode())
    assert StepGroups(records).sweep() == [], what
    await throughout(lambda: process.poll() is None, seconds=0.5, message=f"{what}: the process lives")
    assert records.items() == []  # the record goes all the same: it names nothing any more


async def test_records_of_groups_that_are_gone_are_dropped_and_nothing_is_killed(
    records: Records, started: list[subprocess.Popen[bytes]]
) -> None:
    process = leader(started, "read -r _")
    record = _recorded(process)
    assert process.stdin is not None
    process.stdin.close()
    process.wait(timeout=10)
    records.put(record.key, record.encode())
    records.put("garbage", b"{not json")
    assert StepGroups(records).sweep() == []
    assert records.items() == []


SCRIPT = """
import asyncio, json, sys
from devsched.agent.shell import shell
from devsched.agent.steps import RunIdentity, StepContext, StepUser
from devsched.service import run_loop

async def main() -> None:
    user = json.loads(sys.argv[2])
    ctx = StepContext(
        args={"command": sys.argv[1]}, device_env={}, identity=RunIdentity("t", 1, "l", "d"),
        interrupt=asyncio.Event(), timeout_s=600, stop_grace_s=0.5, tmpdir=sys.argv[3],
        user=None if user is None else StepUser(*user),
    )
    await shell(ctx)

run_loop(main())  # the loop DEVSCHED_EVENT_LOOP names, as the agent's
"""

NOBODY = pwd.getpwnam("nobody")
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="running a step as another user needs root")
#: The agent's loops: uvloop's (the default) and asyncio's.
LOOPS = pytest.mark.parametrize("event_loop", ["uvloop", "asyncio"])
#: As the agent's own user, and as a step user (the parent-death signal must outlive the switch to it).
USERS = pytest.mark.parametrize(
    "step_user", [pytest.param(False, id="agent-user"), pytest.param(True, id="step-user", marks=as_root)]
)


@LOOPS
@USERS
async def test_a_step_dies_with_the_process_that_started_it_but_not_its_own_children(
    passable: Path, event_loop: str, step_user: bool
) -> None:
    tmp_path = passable
    user = None
    if step_user:
        os.chown(passable, NOBODY.pw_uid, NOBODY.pw_gid)
        user = [NOBODY.pw_name, NOBODY.pw_uid, NOBODY.pw_gid, None]
    leader_file, child_file = tmp_path / "leader.pid", tmp_path / "child.pid"
    command = f"echo $$ > {leader_file}; sleep 60 & echo $! > {child_file}; wait"
    agent = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        SCRIPT,
        command,
        json.dumps(user),
        str(passable),
        env={**os.environ, "DEVSCHED_EVENT_LOOP": event_loop},
    )
    child = None
    try:
        step = await eventually(lambda: read_pid(leader_file), timeout=20, message="step started")
        child = await eventually(lambda: read_pid(child_file), timeout=20, message="step's child started")
        agent.kill()  # SIGKILL: the agent runs no code of its own any more
        await agent.wait()
        await gone(step)  # the parent-death signal
        assert process_running(child)  # not the step's own child: the sweep at the next start is for that
    finally:
        if agent.returncode is None:
            agent.kill()
            await agent.wait()
        if child is not None and process_running(child):
            os.kill(child, signal.SIGKILL)
