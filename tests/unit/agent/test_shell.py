from __future__ import annotations

import asyncio
import os
import pwd
import time
from pathlib import Path
from typing import Any

import pytest
import uvloop

from devsched.agent.orphans import StepGroups
from devsched.agent.shell import OutputTail, shell
from devsched.agent.spool import Spool
from devsched.agent.steps import OUTPUT_TAIL_BYTES, ActionError, GroupLedger, StepContext, StepUser
from devsched.protocol.plans import StepStatus
from support.polling import eventually

from .helpers import IDENTITY, process_running, read_pid

pytestmark = pytest.mark.unit


def context(
    args: dict[str, Any],
    *,
    timeout_s: float = 30.0,
    interrupt: asyncio.Event | None = None,
    device_env: dict[str, str] | None = None,
    grace: float = 0.5,
    tmpdir: str | None = None,
    user: StepUser | None = None,
    groups: GroupLedger | None = None,
) -> StepContext:
    return StepContext(
        args=args,
        device_env=device_env or {},
        identity=IDENTITY,
        interrupt=interrupt or asyncio.Event(),
        timeout_s=timeout_s,
        stop_grace_s=grace,
        tmpdir=tmpdir,
        user=user,
        groups=groups,
    )


async def gone(pid: int) -> None:
    await eventually(lambda: not process_running(pid), timeout=10, message=f"process {pid} gone")


async def test_step_sees_device_step_and_attempt_variables(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FROM_AGENT", "agent")
    out = tmp_path / "env.txt"
    result = await shell(
        context(
            {
                "command": f"env > {out}",
                # A step may override the device's env, but never the attempt's identity.
                "env": {"STEP_VAR": "step", "SHARED": "step", "DEVSCHED_LEASE_ID": "forged"},
            },
            device_env={"ANDROID_SERIAL": "33ab12", "SHARED": "device"},
        )
    )
    assert result.status is StepStatus.DONE
    assert result.exit_code == 0
    env = dict(line.split("=", 1) for line in out.read_text().splitlines() if "=" in line)
    assert env["DEVSCHED_TASK_ID"] == "task-1"
    assert env["DEVSCHED_ATTEMPT"] == "2"
    assert env["DEVSCHED_LEASE_ID"] == "lease-3"
    assert env["DEVSCHED_DEVICE_ID"] == "dev-4"
    assert env["ANDROID_SERIAL"] == "33ab12"
    assert env["STEP_VAR"] == "step"
    assert env["SHARED"] == "step"
    assert "FROM_AGENT" not in env  # the agent's own environment never reaches a step


@pytest.mark.parametrize(("command", "status", "code"), [("true", "done", 0), ("exit 3", "failed", 3)])
async def test_exit_code_decides_the_status(command: str, status: str, code: int) -> None:
    result = await shell(context({"command": command}))
    assert result.status == status
    assert result.exit_code == code


async def test_output_tail_keeps_the_last_bytes_of_stdout_and_stderr() -> None:
    # stdout and stderr are two pipes, read in the order their output arrives: a pause keeps the order
    command = "head -c 20000 /dev/zero | tr '\\0' x; echo; sleep 0.2; echo to-stderr >&2; sleep 0.2; echo the-end"
    result = await shell(context({"command": command}))
    assert result.status is StepStatus.DONE
    assert len(result.output_tail.encode()) <= OUTPUT_TAIL_BYTES
    assert result.output_tail.endswith("to-stderr\nthe-end\n")
    assert result.output_tail.startswith("xxx")


def test_output_tail_has_no_nul_characters() -> None:
    # Postgres refuses \u0000 in JSON text: a report with one in its tail could never be recorded
    tail = OutputTail()
    tail.feed(b"a\x00b\xff")
    assert tail.text() == "a\ufffdb\ufffd"


def test_output_tail_bounds_memory_and_cuts_cleanly() -> None:
    tail = OutputTail(limit=8)
    for _ in range(100):
        tail.feed("é".encode() * 5)
    assert tail.total == 1000
    assert tail.text() == "éééé"


async def test_cwd_is_honoured(tmp_path: Path) -> None:
    await shell(context({"command": "pwd > where.txt", "cwd": str(tmp_path)}))
    assert (tmp_path / "where.txt").read_text().strip() == str(tmp_path)


async def test_missing_cwd_fails_the_step_with_a_message(tmp_path: Path) -> None:
    result = await shell(context({"command": "true", "cwd": str(tmp_path / "nope")}))
    assert result.status is StepStatus.FAILED
    assert result.exit_code is None
    assert "nope" in result.output_tail


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ({}, "command: Field required"),
        ({"command": ""}, "command: String should have at least 1 character"),
        ({"command": 5}, "command: Input should be a valid string"),
        ({"command": "true", "shell": "bash"}, "shell: unknown argument"),
        ({"command": "true", "env": {"A": 1}}, "env.A: Input should be a valid string"),
    ],
)
async def test_bad_arguments_are_named(args: dict[str, Any], expected: str) -> None:
    with pytest.raises(ActionError, match="invalid args for action 'shell'") as caught:
        await shell(context(args))
    assert expected in str(caught.value)


async def test_timeout_kills_the_whole_process_group(tmp_path: Path) -> None:
    shell_pid, child_pid = tmp_path / "shell.pid", tmp_path / "child.pid"
    command = f"echo $$ > {shell_pid}; sleep 60 & echo $! > {child_pid}; echo started; wait"
    result = await shell(context({"command": command}, timeout_s=0.5))
    assert result.status is StepStatus.TIMED_OUT
    assert "started" in result.output_tail
    for path in (shell_pid, child_pid):
        pid = read_pid(path)
        assert pid is not None
        await gone(pid)


async def test_sigkill_follows_an_ignored_sigterm(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    command = f"trap '' TERM; echo $$ > {pid_file}; while :; do sleep 0.05; done"
    started = time.monotonic()
    result = await shell(context({"command": command}, timeout_s=0.3, grace=0.3))
    assert result.status is StepStatus.TIMED_OUT
    assert result.exit_code == -9
    pid = read_pid(pid_file)
    assert pid is not None
    await gone(pid)
    assert time.monotonic() - started < 20


async def test_interrupt_stops_a_running_step_quickly(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    interrupt = asyncio.Event()
    task = asyncio.create_task(shell(context({"command": f"echo $$ > {pid_file}; exec sleep 60"}, interrupt=interrupt)))
    pid = await eventually(lambda: read_pid(pid_file), message="step started")
    assert pid is not None
    started = time.monotonic()
    interrupt.set()
    result = await asyncio.wait_for(task, 20)
    assert result.status is StepStatus.INTERRUPTED
    assert result.exit_code == -15
    await gone(pid)
    # Far below the 60 s the step would have run: the interrupt, not the end of the step, ended it.
    assert time.monotonic() - started < 20


async def test_processes_left_behind_by_a_finished_step_are_stopped(tmp_path: Path) -> None:
    child_pid = tmp_path / "child.pid"
    result = await shell(context({"command": f"sleep 60 & echo $! > {child_pid}; echo bye"}))
    assert result.status is StepStatus.DONE
    assert "stopped processes the step left running" in result.output_tail
    pid = read_pid(child_pid)
    assert pid is not None
    await gone(pid)


async def test_an_escaped_process_holding_stdout_does_not_hang_the_step(tmp_path: Path) -> None:
    pid_file = tmp_path / "escapee.pid"
    command = f"setsid sh -c 'echo $$ > {pid_file}; exec sleep 60' & sleep 0.1; echo out"
    try:
        result = await asyncio.wait_for(shell(context({"command": command})), 20)
        assert result.status is StepStatus.DONE
    finally:
        pid = await eventually(lambda: read_pid(pid_file), message="escapee started")
        assert pid is not None
        os.kill(pid, 9)


async def test_cancelling_the_action_kills_the_group(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    task = asyncio.create_task(shell(context({"command": f"echo $$ > {pid_file}; exec sleep 60"})))
    pid = await eventually(lambda: read_pid(pid_file), message="step started")
    assert pid is not None
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await gone(pid)


async def test_the_attempt_directory_is_tmpdir_and_the_default_cwd(tmp_path: Path) -> None:
    result = await shell(context({"command": 'echo "$TMPDIR $(pwd)"'}, tmpdir=str(tmp_path)))
    assert result.output_tail == f"{tmp_path} {tmp_path}\n"
    other = tmp_path / "other"
    other.mkdir()
    result = await shell(context({"command": "pwd", "cwd": str(other)}, tmpdir=str(tmp_path)))
    assert result.output_tail == f"{other}\n"  # an explicit cwd still wins


@pytest.mark.parametrize(
    ("env", "message"), [({"A=B": "x"}, "variable name 'A=B'"), ({"A": "x\0"}, "variable 'A' holds a NUL byte")]
)
async def test_a_variable_that_cannot_be_in_an_environment_fails_the_step_by_name(
    env: dict[str, str], message: str
) -> None:
    # the protocol's ShellArgs refuses it (at submit, and here again before anything starts)
    with pytest.raises(ActionError, match="invalid args for action 'shell': env: ") as refused:
        await shell(context({"command": "true", "env": env}))
    assert message in str(refused.value)


NOBODY = pwd.getpwnam("nobody")
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="running a step as another user needs root")


@as_root
async def test_a_step_user_step_runs_with_that_uid_its_group_only_and_its_home(passable: Path) -> None:
    os.chown(passable, NOBODY.pw_uid, NOBODY.pw_gid)
    user = StepUser(NOBODY.pw_name, NOBODY.pw_uid, NOBODY.pw_gid, None)
    command = 'echo "$(id -u) $(id -g) $(id -G) $HOME"; touch "$TMPDIR/mine"'
    result = await shell(context({"command": command}, tmpdir=str(passable), user=user))
    assert result.status is StepStatus.DONE, result.output_tail
    assert result.output_tail == f"{NOBODY.pw_uid} {NOBODY.pw_gid} {NOBODY.pw_gid} {passable}\n"
    assert os.stat(passable / "mine").st_uid == NOBODY.pw_uid
    with_home = StepUser(NOBODY.pw_name, NOBODY.pw_uid, NOBODY.pw_gid, "/some/home")
    result = await shell(context({"command": 'echo "$HOME"'}, tmpdir=str(passable), user=with_home))
    assert result.output_tail == "/some/home\n"


@as_root
async def test_a_step_user_step_is_still_stopped_as_a_group(passable: Path) -> None:
    os.chown(passable, NOBODY.pw_uid, NOBODY.pw_gid)
    user = StepUser(NOBODY.pw_name, NOBODY.pw_uid, NOBODY.pw_gid, None)
    pid_file = passable / "child"
    interrupt = asyncio.Event()
    command = f"sleep 600 & echo $! > {pid_file}; trap '' TERM; wait; sleep 600"
    running = asyncio.create_task(
        shell(context({"command": command}, interrupt=interrupt, tmpdir=str(passable), user=user, grace=0.3))
    )
    await eventually(lambda: read_pid(pid_file) is not None, timeout=10, message="child started")
    child = read_pid(pid_file)
    assert child is not None
    assert os.stat(f"/proc/{child}").st_uid == NOBODY.pw_uid
    interrupt.set()
    result = await asyncio.wait_for(running, 10)
    assert result.status is StepStatus.INTERRUPTED
    await gone(child)


async def test_the_command_runs_only_once_its_process_group_is_recorded(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "spool")
    groups = StepGroups.in_spool(spool)
    recorded = spool.directory / "groups"
    listing, pid_file = tmp_path / "listing", tmp_path / "pid"
    command = f"ls {recorded} > {listing}; echo $$ > {pid_file}; readlink /proc/$$/fd/0"
    result = await shell(context({"command": command}, groups=groups))
    assert result.status is StepStatus.DONE
    assert result.output_tail == "/dev/null\n"  # the go on stdin is not the command's: it reads nothing
    pid = read_pid(pid_file)
    [name] = listing.read_text().split()
    assert name.startswith(f"{pid}.")  # the step's own group, there before its first command
    assert list(recorded.iterdir()) == []  # forgotten once the group is stopped


@as_root
async def test_on_uvloop_a_step_user_enters_its_cwd_as_itself(passable: Path) -> None:
    # uvloop's child becomes the step user (in `preexec_fn`) before it enters the working directory;
    # asyncio's enters it first, as the agent.
    os.chown(passable, NOBODY.pw_uid, NOBODY.pw_gid)
    closed = passable / "root-only"
    closed.mkdir(mode=0o700)
    user = StepUser(NOBODY.pw_name, NOBODY.pw_uid, NOBODY.pw_gid, None)
    result = await shell(context({"command": "pwd", "cwd": str(closed)}, tmpdir=str(passable), user=user))
    if isinstance(asyncio.get_running_loop(), uvloop.Loop):
        assert result.status is StepStatus.FAILED
        assert result.exit_code is None
        assert "cannot start the shell step" in result.output_tail
        assert str(closed) in result.output_tail
    else:
        assert result.status is StepStatus.DONE, result.output_tail
        assert result.output_tail == f"{closed}\n"
