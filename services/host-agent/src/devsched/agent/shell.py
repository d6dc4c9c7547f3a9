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
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import tempfile
from typing import Any

from devsched.agent.orphans import die_with_agent
from devsched.agent.procfs import has_proc, processes
from devsched.agent.step_env import StepEnvError, step_environment
from devsched.agent.steps import (
    OUTPUT_TAIL_BYTES,
    ActionResult,
    OutputSink,
    StepContext,
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
    as_user: dict[str, Any] = {}
    if ctx.user is not None:
        as_user = {"user": ctx.user.uid, "group": ctx.user.gid, "extra_groups": []}
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
            cwd=args.cwd if args.cwd is not None else ctx.tmpdir,
            start_new_session=True,
            preexec_fn=die_with_agent(),
            **as_user,
        )
    except OSError as exc:
        os.close(out_read)
        os.close(err_read)
        os.close(gate_write)
        return ActionResult(StepStatus.FAILED, None, f"cannot start the shell step: {exc}")
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
