"""The `shell` action: `/bin/sh -c command` in its own process group, stopped as a group.

The step's processes get their own session (`start_new_session`), so one signal reaches the shell and
everything it started. A step that times out, or is interrupted, gets SIGTERM, then SIGKILL after the
grace period. Processes a step leaves behind when its shell exits are stopped the same way: the device
must be free of the previous attempt's work before the next one starts.

Nor does a step outlive the agent (`orphans.py`): the kernel SIGKILLs the step's shell when the agent
dies, and the command runs only once its process group is recorded in the spool (the shell waits on
stdin for the go), so the next start of the agent kills whatever the shell started.

Output goes to two pipes that the agent owns, stdout and stderr (not asyncio subprocess pipes: in
Python 3.11 `Process.wait()` waits for the subprocess pipes to close, so a background process holding
stdout would hang it). Here the exit and the end of output are awaited separately, each bounded. Both
pipes are read at once; what is read goes, in the order read, into the report's tail (one tail for both)
and to the step's output sink (the attempt's log stream), which never makes the reading wait.

The step's environment is built by `step_env.step_environment` (never the agent's own), and with a step
user its processes run as that user and its primary group (no supplementary groups). The agent stays
able to signal them: it keeps CAP_KILL (root has it), which `workspace.resolve_step_user` checks at start.

The child becomes the step user in its `preexec_fn` (`_step_child`: the groups, the group, then the user,
then the parent-death signal, which a change of credentials would clear), not through
`create_subprocess_exec`'s `user`/`group`/`extra_groups`: uvloop's loop (the services' loop,
`devsched.service.lifecycle`) has none of those, and runs `preexec_fn` first thing after the fork,
where asyncio's runs it last before the exec. So the two loops start a step the same way, except that
uvloop enters the working directory after the switch, as the step user, where asyncio enters it before
(as the agent).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import subprocess
import tempfile
from collections.abc import Callable

from devsched.agent.orphans import die_with_agent
from devsched.agent.procfs import has_proc, processes
from devsched.agent.step_env import StepEnvError, step_environment
from devsched.agent.steps import (
    OUTPUT_TAIL_BYTES,
    ActionResult,
    OutputSink,
    StepContext,
    StepUser,
    parse_args,
    tail_text,
)
from devsched.protocol.logs import OutputStream
from devsched.protocol.plans import ShellArgs, StepStatus

logger = logging.getLogger(__name__)

#: How often a process group is checked for having emptied.
_POLL_S = 0.02
#: How long the output pipe may stay open after the step's processes are gone (held by an escapee).
_DRAIN_S = 1.0
_READ_CHUNK = 65536
#: What the step's process runs first: it waits for the agent's go (a line on stdin, written once the
#: step's process group is recorded), gives the command /dev/null as stdin, and becomes `/bin/sh -c command`
#: (same pid, so the same group leader). EOF instead of the go (the agent gave up) ends it unstarted.
_GATE = 'read -r _ || exit 125; exec </dev/null; exec /bin/sh -c "$1"'


class OutputTail:
    """Keeps the last `limit` bytes of a stream, in bounded memory."""

    def __init__(self, limit: int = OUTPUT_TAIL_BYTES) -> None:
        self._limit = limit
        self._buffer = bytearray()
        #: Bytes seen in total.
        self.total = 0

    def feed(self, chunk: bytes) -> None:
        """Append `chunk`, forgetting what falls out of the tail."""
        self.total += len(chunk)
        self._buffer += chunk
        if len(self._buffer) > 2 * self._limit:
            del self._buffer[: -self._limit]

    def text(self) -> str:
        """The tail as text."""
        return tail_text(self._buffer, self._limit)


def _signal_group(pgid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signum)


def group_alive(pgid: int) -> bool:
    """Whether any process of process group `pgid` is still running.

    Zombies do not count: where nothing reaps orphans (a container whose PID 1 is not an init), an
    orphaned step process stays a zombie forever, and it holds nothing.
    """
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # the group exists but is another user's (a step user, an agent without CAP_KILL): /proc decides
    if not has_proc():
        return True
    return any(p.pgid == pgid and p.alive for p in processes())


async def _group_gone(pgid: int) -> None:
    # The kernel gives no event for "process group emptied" (grandchildren are not our children): poll.
    while group_alive(pgid):  # noqa: ASYNC110
        await asyncio.sleep(_POLL_S)


async def stop_group(process: asyncio.subprocess.Process, grace_s: float) -> None:
    """SIGTERM the process group of `process`, SIGKILL it after `grace_s`, and reap `process`."""
    _signal_group(process.pid, signal.SIGTERM)
    try:
        async with asyncio.timeout(grace_s):
            await process.wait()
            await _group_gone(process.pid)
    except TimeoutError:
        _signal_group(process.pid, signal.SIGKILL)
        await process.wait()


async def _pump(reader: asyncio.StreamReader, tail: OutputTail, sink: OutputSink | None, stream: OutputStream) -> None:
    while chunk := await reader.read(_READ_CHUNK):
        tail.feed(chunk)
        if sink is not None:
            try:
                sink.write(stream, chunk)
            except Exception:
                # The pipe must still be read, or the step would block on a full pipe: go on without the sink.
                logger.exception("step output sink failed; the step's output goes to its tail only")
                sink = None


async def _open_reader(read_fd: int) -> tuple[asyncio.StreamReader, asyncio.BaseTransport]:
    reader = asyncio.StreamReader()
    transport, _ = await asyncio.get_running_loop().connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(read_fd, "rb", buffering=0)
    )
    return reader, transport


def _step_child(user: StepUser | None) -> Callable[[], None]:
    """The `preexec_fn` of a step's shell: become `user` (if any), then arm the parent-death signal."""
    arm = die_with_agent()
    if user is None:
        return arm
    uid, gid = user.uid, user.gid

    def become_user_then_arm() -> None:
        # The order of subprocess's own `extra_groups=[]`, `group=`, `user=`: groups while still root.
        os.setgroups([])
        os.setgid(gid)
        os.setuid(uid)
        arm()  # after the switch: the kernel clears a parent-death signal when the credentials change

    return become_user_then_arm


def _start_failure(exc: OSError | subprocess.SubprocessError, cwd: str | None) -> str:
    """Why the shell did not start, naming the working directory where the error does not."""
    if isinstance(exc, subprocess.SubprocessError):  # raised by `_step_child`, its own error as the cause
        why = f"{exc} {exc.__cause__!r}" if exc.__cause__ is not None else str(exc)
    else:
        why = str(exc)
    if cwd is not None and (not isinstance(exc, OSError) or exc.filename is None):
        why += f" (cwd {cwd!r})"  # uvloop's errors name no file: the directory is the likely cause
    return f"cannot start the shell step: {why}"


async def _supervise(process: asyncio.subprocess.Process, ctx: StepContext) -> StepStatus:
    """Wait for the exit, the timeout or the interrupt, whichever comes first; stop the group if not exit."""
    exited = asyncio.ensure_future(process.wait())
    interrupted = asyncio.ensure_future(ctx.interrupt.wait())
    try:
        done, _ = await asyncio.wait({exited, interrupted}, timeout=ctx.timeout_s, return_when=asyncio.FIRST_COMPLETED)
    finally:
        interrupted.cancel()
    if exited in done:
        return StepStatus.DONE if exited.result() == 0 else StepStatus.FAILED
    exited.cancel()
    await stop_group(process, ctx.stop_grace_s)
    return StepStatus.INTERRUPTED if interrupted in done else StepStatus.TIMED_OUT


async def shell(ctx: StepContext) -> ActionResult:
    """Run `args.command` with `/bin/sh -c`; see the module docstring for how it is stopped."""
    args = parse_args(ShellArgs, "shell", ctx.args)
    tmpdir = ctx.tmpdir or tempfile.gettempdir()
    try:
        env = step_environment(
            os.environ,
            tmpdir=tmpdir,
            device_env=ctx.device_env,
            step_env=args.env,
            identity_env=ctx.identity.env(),
            home=None if ctx.user is None else (ctx.user.home or tmpdir),
            artifacts_dir=ctx.artifacts_dir,
        )
    except StepEnvError as exc:
        return ActionResult(StepStatus.FAILED, None, f"cannot start the shell step: {exc}")
    cwd = args.cwd if args.cwd is not None else ctx.tmpdir
    gate_read, gate_write = os.pipe()
    out_read, out_write = os.pipe()
    err_read, err_write = os.pipe()
    try:
        # From this (the event loop's) thread: the parent-death signal comes when the forking thread exits.
        process = await asyncio.create_subprocess_exec(
            "/bin/sh",
            "-c",
            _GATE,
            "devsched-step",
            args.command,
            stdin=gate_read,
            stdout=out_write,
            stderr=err_write,
            env=env,
            cwd=cwd,
            start_new_session=True,
            preexec_fn=_step_child(ctx.user),
        )
    except (OSError, subprocess.SubprocessError) as exc:
        os.close(out_read)
        os.close(err_read)
        os.close(gate_write)
        return ActionResult(StepStatus.FAILED, None, _start_failure(exc, cwd))
    finally:
        os.close(out_write)
        os.close(err_write)
        os.close(gate_read)

    out_reader, out_transport = await _open_reader(out_read)
    err_reader, err_transport = await _open_reader(err_read)
    tail = OutputTail()
    pumps = asyncio.gather(
        _pump(out_reader, tail, ctx.output, OutputStream.STDOUT),
        _pump(err_reader, tail, ctx.output, OutputStream.STDERR),
    )
    note = ""
    try:
        try:
            if ctx.groups is not None:
                await ctx.groups.record(process.pid, ctx.identity)
            with contextlib.suppress(BrokenPipeError):  # the shell is gone already: `_supervise` sees it
                os.write(gate_write, b"\n")  # the command runs from here on
        finally:
            os.close(gate_write)  # unopened, the gate ends the shell before the command (exit 125)
        status = await _supervise(process, ctx)
        if group_alive(process.pid):
            note = "\n[devsched-agent: stopped processes the step left running]\n"
            await stop_group(process, ctx.stop_grace_s)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(pumps, _DRAIN_S)
    finally:
        # Reached with the group still alive only when this task is cancelled: leave nothing behind.
        if process.returncode is None or group_alive(process.pid):
            _signal_group(process.pid, signal.SIGKILL)
        pumps.cancel()
        out_transport.close()
        err_transport.close()
        if process.returncode is None:
            # Reap the killed shell (prompt after SIGKILL) so no zombie or open transport is left.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(process.wait()), _DRAIN_S)
        if ctx.groups is not None:
            await ctx.groups.forget(process.pid)
    return ActionResult(status, process.returncode, tail.text() + note)
