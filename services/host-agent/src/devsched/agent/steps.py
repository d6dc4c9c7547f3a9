"""What an action is given and what it gives back: the vocabulary shared by actions and the runner."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from pydantic import BaseModel, ValidationError

from devsched.protocol.logs import OutputStream
from devsched.protocol.plans import StepStatus

#: How much of a step's combined stdout/stderr is kept for the report (the last bytes, in the order read).
OUTPUT_TAIL_BYTES = 4096


#: Statuses of a step that went wrong on its own (not because the run was stopped).
FAILURES: frozenset[StepStatus] = frozenset({StepStatus.FAILED, StepStatus.TIMED_OUT})


class Interrupt(Protocol):
    """A one-way signal that tells a running step to stop early (an `asyncio.Event` is one)."""

    def is_set(self) -> bool:
        """Whether the step should stop now."""
        ...

    async def wait(self) -> Any:
        """Return once the step should stop."""
        ...


@dataclass(frozen=True, slots=True)
class RunIdentity:
    """Which attempt a step belongs to; handed to `shell` steps as environment variables."""

    task_id: str
    attempt: int
    #: A fencing token that external systems can check.
    lease_id: str
    device_id: str

    def env(self) -> dict[str, str]:
        """The `DEVSCHED_*` variables of a step."""
        return {
            "DEVSCHED_TASK_ID": self.task_id,
            "DEVSCHED_ATTEMPT": str(self.attempt),
            "DEVSCHED_LEASE_ID": self.lease_id,
            "DEVSCHED_DEVICE_ID": self.device_id,
        }


class GroupLedger(Protocol):
    """Where an action records the process groups it starts, so that none outlives a killed agent.

    `record` is awaited before the group's command runs; `forget` once the group is stopped.
    """

    async def record(self, pgid: int, identity: RunIdentity) -> None:
        """Record the group led by `pgid` (a live process) as a group of `identity`'s attempt."""
        ...

    async def forget(self, pgid: int) -> None:
        """Drop the record of the group led by `pgid` (it is stopped)."""
        ...


class OutputSink(Protocol):
    """Where an action hands the output of its step as it reads it (the attempt's log stream).

    `write` is called from the reading loop and returns at once: it never waits for the network.
    """

    def write(self, stream: OutputStream, data: bytes) -> None:
        """Take `data` the step wrote to `stream`."""
        ...


class RunLog(Protocol):
    """The output of one attempt's steps as the runner sees it: one sink per step, and each step's end."""

    def step(self, name: str, index: int) -> OutputSink:
        """The sink of the step `name` at plan index `index`, about to start."""
        ...

    def step_end(self, name: str, index: int, status: StepStatus, exit_code: int | None) -> None:
        """The step at `index` has ended."""
        ...


@dataclass(frozen=True, slots=True)
class StepUser:
    """The unprivileged user that steps run as (`step_user` in agent.toml), resolved at the agent's start."""

    name: str
    uid: int
    #: Its primary group: the step's only group (no supplementary groups are kept).
    gid: int
    #: Its home directory when that exists; None gives the step the per-attempt directory as `HOME`.
    home: str | None


@dataclass(frozen=True, slots=True)
class StepContext:
    """Everything an action gets for one step."""

    #: The step's `args`, as sent (validate them with `parse_args`).
    args: Mapping[str, Any]
    #: The device's configured `env`.
    device_env: Mapping[str, str]
    identity: RunIdentity
    #: Set when the step must stop early: the action returns `interrupted` soon after.
    interrupt: Interrupt
    #: The step's `timeout_s`: past it the action stops and returns `timed_out`.
    timeout_s: float
    #: Time between SIGTERM and SIGKILL when a process group is stopped.
    stop_grace_s: float
    #: The attempt's own directory (`TMPDIR`, the default `cwd`); None outside an attempt (the system's).
    tmpdir: str | None = None
    #: The attempt's artifacts directory (`DEVSCHED_ARTIFACTS_DIR`); None outside an attempt.
    artifacts_dir: str | None = None
    #: Who the step's processes run as; None: the agent's own user.
    user: StepUser | None = None
    #: Where the step's process groups are recorded; None: nowhere (outside an agent).
    groups: GroupLedger | None = None
    #: Where the step's output goes as it is read (the attempt's log stream); None: only the report's tail.
    output: OutputSink | None = None


@dataclass(frozen=True, slots=True)
class ActionResult:
    """How an action ended."""

    status: StepStatus
    exit_code: int | None = None
    output_tail: str = ""


#: An action: run one step and say how it ended. It honours `timeout_s` and `interrupt` itself.
Action = Callable[[StepContext], Awaitable[ActionResult]]


@dataclass(frozen=True, slots=True)
class ActionPlugin:
    """What a plug-in package exposes under the `devsched.actions` entry-point group (the entry's name is the action's).

    ```toml
    [project.entry-points."devsched.actions"]
    adb-instrument = "devsched.plugins.adb:plugin"
    ```
    """

    #: Runs one step (see `Action`); validate `ctx.args` with `parse_args(args, ...)`.
    run: Action
    #: The model of its `args`: the host advertises its JSON Schema, and the scheduler checks args at submit.
    args: type[BaseModel] | None = None
    #: Its version; None: the version of the package that declares the entry point.
    version: str | None = None


class ActionError(Exception):
    """A step cannot run: unknown action or bad arguments. The step fails with this message."""


M = TypeVar("M", bound=BaseModel)


def parse_args(model: type[M], action: str, args: Mapping[str, Any]) -> M:
    """Validate a step's `args` for `action` against `model`.

    Raises:
        ActionError: naming every offending argument.
    """
    try:
        return model.model_validate(dict(args))
    except ValidationError as exc:
        problems = []
        for item in exc.errors():
            where = ".".join(str(part) for part in item["loc"]) or "args"
            message = "unknown argument" if item["type"] == "extra_forbidden" else item["msg"]
            problems.append(f"{where}: {message}")
        raise ActionError(f"invalid args for action {action!r}: " + "; ".join(problems)) from None


def tail_text(data: bytes | bytearray, limit: int = OUTPUT_TAIL_BYTES) -> str:
    """The last `limit` bytes of `data` as text, without a broken character at the cut.

    Undecodable bytes and NUL become U+FFFD: the tail is stored as JSON text in Postgres, which refuses
    `\u0000` (a report holding one could never be recorded). The full bytes are in the log stream.
    """
    cut = bytes(data[-limit:])
    if len(data) > limit:
        # Drop UTF-8 continuation bytes left over from a character that was cut in half.
        start = 0
        while start < min(3, len(cut)) and cut[start] & 0xC0 == 0x80:
            start += 1
        cut = cut[start:]
    return cut.decode("utf-8", errors="replace").replace("\x00", "\ufffd")
