"""What a task runs and where: steps, plans, selectors, progress and per-step results."""

from __future__ import annotations

import posixpath
from collections import Counter
from enum import StrEnum
from typing import Annotated, Any

from pydantic import Field, ValidationError, ValidationInfo, field_validator, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError

from devsched.core.actions import is_reserved
from devsched.protocol.artifacts import StepArtifacts
from devsched.protocol.base import (
    JsonObject,
    Labels,
    Lax,
    Name,
    RequestModel,
    Seconds,
    ShortName,
    Timestamp,
    Token,
    bounded_text,
    text_schema,
)

__all__ = [
    "BUILTIN_ARGS",
    "MAX_STEPS",
    "FailedTest",
    "NoopArgs",
    "Plan",
    "Progress",
    "ResultFiles",
    "ResultsSummary",
    "RunResult",
    "Selector",
    "ShellArgs",
    "SleepArgs",
    "Step",
    "StepResult",
    "StepStatus",
]

#: Most steps a plan may have.
MAX_STEPS = 100
#: Longest path of a step's results file (`results.junit`), in characters; each part of it at most 255.
MAX_RESULTS_PATH_CHARS = 1024
_MAX_PATH_PART_CHARS = 255
#: Longest working directory of a `shell` step, in characters (Linux's PATH_MAX is 4096 bytes).
MAX_CWD_CHARS = 4096
#: Longest output tail of a step result, in characters (the agent sends the last 4 KiB of a shell step's output).
MAX_OUTPUT_TAIL_CHARS = 64 * 1024
#: Most failing tests a results summary names (the counts cover them all).
MAX_FAILED_LISTED = 20
#: Longest test name or class name in a results summary, in characters (longer ones are cut).
MAX_TEST_NAME_CHARS = 512
#: Longest failure message, or reason a results file could not be read, in characters (longer ones are cut).
MAX_RESULTS_MESSAGE_CHARS = 1024


def _unless_none(value: object) -> bool:
    # A field added to an existing message is left out when it is null, so a plan or a result that does not
    # use it is written exactly as before (the contract writes every field, nulls included, of the rest).
    return value is None


class ShellArgs(RequestModel):
    """Arguments of the built-in `shell` action."""

    command: Name
    """The shell command line to run."""
    env: dict[str, str] = Field(default_factory=dict)
    """Extra environment variables, on top of the device's `env` and the `DEVSCHED_*` ones."""
    cwd: Annotated[str, bounded_text(MAX_CWD_CHARS), text_schema(MAX_CWD_CHARS)] | None = None
    """Working directory; the attempt's own directory when null."""

    @field_validator("env")
    @classmethod
    def _env_names(cls, env: dict[str, str]) -> dict[str, str]:
        # The agent could not set such a variable (the kernel splits a name at "=", NUL ends it): refused
        # at submit rather than failing the step on the device.
        for name, value in env.items():
            if not name or "=" in name or "\0" in name:
                raise ValueError(f"environment variable name {name!r} is empty or holds '=' or NUL")
            if "\0" in value:
                raise ValueError(f"environment variable {name!r} holds a NUL byte")
        return env


class SleepArgs(RequestModel):
    """Arguments of the built-in `sleep` action."""

    seconds: Seconds
    """How long to sleep; fractional allowed, > 0."""


class NoopArgs(RequestModel):
    """Arguments of the built-in `noop` action: none."""


#: Argument models of the built-in actions (`devsched.core.actions.BUILTIN_ACTIONS`); any other action is a
#: plug-in, whose args the scheduler checks against the JSON Schema its hosts advertise.
BUILTIN_ARGS: dict[str, type[RequestModel]] = {"shell": ShellArgs, "sleep": SleepArgs, "noop": NoopArgs}


class ResultFiles(RequestModel):
    """Where a step leaves machine-readable test results, inside its attempt's artifacts directory."""

    junit: str
    """A JUnit XML file: a relative, normalised path (`reports/junit.xml`), without `..`."""

    @field_validator("junit")
    @classmethod
    def _relative_path(cls, path: str) -> str:
        # The agent opens it beneath the artifacts directory without following links; a path that could
        # point elsewhere is refused here, at submit, rather than on the device after the step ran.
        if not path or "\0" in path:
            raise ValueError("the path is empty or holds a NUL byte")
        if len(path) > MAX_RESULTS_PATH_CHARS:
            raise ValueError(f"the path is longer than {MAX_RESULTS_PATH_CHARS} characters")
        if path.startswith("/"):
            raise ValueError("the path must be relative to the artifacts directory, not absolute")
        parts = path.split("/")
        if ".." in parts:
            raise ValueError("the path must stay inside the artifacts directory ('..' is not allowed)")
        normal = posixpath.normpath(path)
        if normal == ".":
            raise ValueError("the path names no file")
        if normal != path:
            raise ValueError(f"the path must be normalised (write {normal!r})")
        if any(len(part) > _MAX_PATH_PART_CHARS for part in parts):
            raise ValueError(f"a part of the path is longer than {_MAX_PATH_PART_CHARS} characters")
        return path


class Step(RequestModel):
    """One step of a plan."""

    name: ShortName
    """Unique within the plan; reported back in progress and results. At most 200 characters."""
    action: ShortName
    """`shell`, `sleep`, `noop`, or a plugged-in action. At most 200 characters."""
    args: JsonObject = Field(default_factory=dict, validate_default=True)
    """Arguments of the action; checked here for the built-in actions so a typo fails at submit."""
    timeout_s: Seconds = 3600.0
    """Longest the step may run, in seconds (fractional allowed, > 0)."""
    interruptible: bool = False
    """Whether a stop (cancellation, lease loss) may interrupt the step instead of waiting for it."""
    always: bool = False
    """Run even after an earlier failure or a cancellation stop (teardown), while the lease is held."""
    results: ResultFiles | None = Field(default=None, exclude_if=_unless_none)
    """Addition: test results the step writes in `DEVSCHED_ARTIFACTS_DIR`, summarised in its result."""
    infra: bool = Field(default=False, exclude_if=lambda v: v is False)
    """Addition: the step prepares the device or the lab (flashing, booting); its failure is an `infra` one,
    which a task's retry policy may retry on another device. Left out when false."""

    @field_validator("args")
    @classmethod
    def _check_builtin_args(cls, args: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        model = BUILTIN_ARGS.get(info.data.get("action", ""))
        if model is not None:
            try:
                model.model_validate(args, context=info.context)  # a stored plan is not bounded again
            except ValidationError as exc:
                # Raised as a ValidationError, each error keeps its own location, which pydantic appends to
                # this field's: `plan.steps.0.args.seconds`, not `plan.steps.0.args`.
                action = info.data["action"]
                raise ValidationError.from_exception_data(
                    exc.title,
                    [
                        InitErrorDetails(
                            type=PydanticCustomError(
                                "invalid_args",
                                "invalid {action} args: {message}",
                                {"action": action, "message": e["msg"]},
                            ),
                            loc=e["loc"],
                            input=e["input"],
                        )
                        for e in exc.errors()
                    ],
                ) from None
        return args

    def builtin_args(self) -> ShellArgs | SleepArgs | NoopArgs | None:
        """The typed arguments of a built-in action, or None for a plug-in action."""
        model = BUILTIN_ARGS.get(self.action)
        if model is None:
            return None
        parsed = model.model_validate(self.args)
        assert isinstance(parsed, ShellArgs | SleepArgs | NoopArgs)
        return parsed


def refuse_reserved_labels(labels: dict[str, str]) -> dict[str, str]:
    """Refuse label keys of the reserved action prefix (`devsched.core.actions`): only devsched derives them."""
    reserved = sorted(k for k in labels if is_reserved(k))
    if reserved:
        raise PydanticCustomError(
            "reserved_label",
            "label keys starting with 'devsched.action.' are reserved (derived from plug-in actions): {keys}",
            {"keys": ", ".join(reserved)},
        )
    return labels


class Plan(RequestModel):
    """The steps of a task, run in order on one device."""

    steps: list[Step] = Field(min_length=1, max_length=MAX_STEPS)
    """1 to 100 steps with unique names."""

    @field_validator("steps")
    @classmethod
    def _unique_names(cls, steps: list[Step]) -> list[Step]:
        repeated = sorted(name for name, n in Counter(s.name for s in steps).items() if n > 1)
        if repeated:
            raise PydanticCustomError(
                "duplicate_step_name", "step names must be unique; repeated: {names}", {"names": ", ".join(repeated)}
            )
        return steps

    def actions(self) -> list[str]:
        """Every action the plan uses, in plan order, without repeats."""
        return list(dict.fromkeys(step.action for step in self.steps))


class Selector(RequestModel):
    """Which devices a task may run on. The default matches any device."""

    labels: Labels = Field(default_factory=dict)
    """A device matches when its labels contain every one of these pairs (at most 100, keys and values at most
    256 characters each)."""
    device_id: Token | None = None
    """Names one device, when set."""

    _no_reserved_labels = field_validator("labels")(refuse_reserved_labels)


class Progress(RequestModel):
    """Where a running attempt is: the step it is at, by name and position."""

    step: ShortName
    """Name of the current step."""
    index: int = Field(ge=0)
    """0-based position of the step in the plan."""
    of: int = Field(ge=1, le=MAX_STEPS)
    """Number of steps in the plan."""

    @model_validator(mode="after")
    def _index_in_range(self) -> Progress:
        if self.index >= self.of:
            raise PydanticCustomError("index_out_of_range", "index must be below of")
        return self


class StepStatus(StrEnum):
    """How one step of a reported run ended."""

    #: Ran and succeeded.
    DONE = "done"
    #: Ran and failed (non-zero exit, action error).
    FAILED = "failed"
    #: Ran past its `timeout_s` and was stopped.
    TIMED_OUT = "timed_out"
    #: Stopped by a cancellation or lease loss while running (interruptible steps only).
    INTERRUPTED = "interrupted"
    #: Never started (an earlier step failed, or the run stopped).
    SKIPPED = "skipped"


class FailedTest(RequestModel):
    """One failing test of a results summary."""

    name: str = Field(max_length=MAX_TEST_NAME_CHARS)
    """The test case's `name`."""
    classname: str | None = Field(default=None, max_length=MAX_TEST_NAME_CHARS)
    """The test case's `classname`, if it has one."""
    message: str | None = Field(default=None, max_length=MAX_RESULTS_MESSAGE_CHARS)
    """The failure's (or error's) `message`, else the start of its text; null when it has neither."""


class ResultsSummary(RequestModel):
    """What a step's results file says, in numbers and the first failing tests (an addition)."""

    format: ShortName
    """The file's format: `junit`."""
    tests: int = Field(default=0, ge=0)
    """Test cases run, failing and skipped ones included."""
    failures: int = Field(default=0, ge=0)
    """Test cases that failed an assertion."""
    errors: int = Field(default=0, ge=0)
    """Test cases that ended with an unexpected error."""
    skipped: int = Field(default=0, ge=0)
    """Test cases that were skipped."""
    failed: list[FailedTest] = Field(default_factory=list, max_length=MAX_FAILED_LISTED)
    """The first failing tests (failures and errors) in file order, at most `MAX_FAILED_LISTED`."""
    error: str | None = Field(default=None, max_length=MAX_RESULTS_MESSAGE_CHARS)
    """Why the file could not be read (missing, malformed, refused); null when it was. The counts are then 0."""


class StepResult(RequestModel):
    """The result of one step, as the agent reports it."""

    name: ShortName
    """The step's name, in plan order."""
    status: Lax[StepStatus]
    """`done`, `failed`, `timed_out`, `interrupted` or `skipped`."""
    exit_code: int | None = None
    """Exit status of a `shell` step; null when not applicable."""
    started_at: Timestamp | None = None
    """When the step started; null when skipped."""
    finished_at: Timestamp | None = None
    """When the step ended; null when skipped."""
    output_tail: Annotated[str, bounded_text(MAX_OUTPUT_TAIL_CHARS), text_schema(MAX_OUTPUT_TAIL_CHARS)] | None = None
    """The last part of the step's combined output (at most 64 KiB characters)."""
    results: ResultsSummary | None = Field(default=None, exclude_if=_unless_none)
    """Addition: the summary of the step's `results` file, for a step that declared one and ran."""
    artifacts: StepArtifacts | None = Field(default=None, exclude_if=_unless_none)
    """Addition: the files the step left in `DEVSCHED_ARTIFACTS_DIR` (new or changed) that were stored, and
    those that were not, with why; null when it left none."""


class RunResult(RequestModel):
    """What a host reports of a run: every step of the plan, in order."""

    steps: list[StepResult] = Field(default_factory=list, max_length=MAX_STEPS)
    """One entry per plan step."""
