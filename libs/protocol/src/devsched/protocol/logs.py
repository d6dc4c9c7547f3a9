"""Step output as it streams: one record per JetStream message in `<PU>_LOGS` (an addition to the protocol).

The agent publishes each attempt's records on `P.host.<host_id>.log.<task_id>.<attempt>` (`Subjects.host_log`),
numbered by `seq` from 1. Output records carry the bytes of one stream (stdout or stderr) of one step, in the
order the agent read them; control records say where a step ended, where the agent dropped or cut output,
and where the attempt ended. Readers order by `seq` (a publish retried after a failure may be stored after
a later one) and drop repeated `seq`s.

Fields that do not apply to a kind are null, as in task events.
"""

from __future__ import annotations

import base64
import binascii
from enum import StrEnum

from pydantic import Field

from devsched.core.status import Outcome
from devsched.protocol.base import Id, Lax, ReplyModel, Timestamp
from devsched.protocol.plans import StepStatus

__all__ = [
    "DataEncoding",
    "LogKind",
    "LogRecord",
    "OutputStream",
]


class LogKind(StrEnum):
    """What a log record says."""

    #: A piece of one step's stdout or stderr (`data`).
    OUTPUT = "output"
    #: The agent dropped `dropped_bytes` of output from `offset` on: its buffer was full while NATS was slow
    #: or away (the step was never held up for it).
    DROPPED = "dropped"
    #: The attempt's output reached `cap_bytes` at `offset`: no output record of the attempt follows (the
    #: steps ran on, and their output was still read, and counted in the end record).
    TRUNCATED = "truncated"
    #: The logs stream refused `refused_records` of the attempt's records, carrying `dropped_bytes` bytes of
    #: output from `offset` on: its host wrote past its output rate share, and its stream took no new records
    #: for a cool-down. Written once the stream takes records again, in the first refused record's `seq`.
    REFUSED = "refused"
    #: A step that ran has ended (`status`, `exit_code`).
    STEP_END = "step_end"
    #: The attempt has ended: the last record of the attempt.
    END = "end"


class OutputStream(StrEnum):
    """Which of a step's outputs a record's bytes come from."""

    #: The step's standard output.
    STDOUT = "stdout"
    #: The step's standard error.
    STDERR = "stderr"


class DataEncoding(StrEnum):
    """How an output record's `data` holds its bytes."""

    #: The bytes are valid UTF-8, written as the JSON string itself.
    UTF8 = "utf-8"
    #: Any other bytes, base64 (RFC 4648, with padding).
    BASE64 = "base64"


class LogRecord(ReplyModel):
    """JetStream message on `P.host.<host_id>.log.<task_id>.<attempt>` in `<PU>_LOGS`.

    `Nats-Msg-Id` is `<lease_id>.<seq>`: a publish retried after a lost acknowledgement is stored once. The
    lease id, not the task id, because de-duplication spans the whole stream: only the attempt's own host
    (and operators) know it, so no other host can take a record's id first and have it dropped.
    """

    task_id: Id
    """The task."""
    attempt: int = Field(ge=1)
    """The attempt whose output this is."""
    seq: int = Field(ge=1)
    """The attempt's records counted from 1 in the order the agent made them: readers order by it."""
    kind: Lax[LogKind]
    """What the record says."""
    at: Timestamp
    """When the agent read the record's first byte (output), or made it (the other kinds)."""
    offset: int = Field(ge=0)
    """Bytes of output the attempt had produced before this record (both streams, dropped bytes included):
    a jump between output records is output dropped or cut."""
    step: str | None = None
    """The step that produced the output, or that ended (null on `end`)."""
    index: int | None = Field(default=None, ge=0)
    """That step's index in the plan."""
    stream: Lax[OutputStream] | None = None
    """`output` only: stdout or stderr."""
    encoding: Lax[DataEncoding] | None = None
    """`output` only: how `data` holds the bytes."""
    data: str | None = None
    """`output` only: the bytes (see `encoding`; `content()` decodes them)."""
    dropped_bytes: int | None = Field(default=None, ge=0)
    """`dropped`: how many bytes were dropped from `offset` on; `end`: dropped in the whole attempt (the bytes of
    refused records not counted); `refused`: bytes of output the refused records carried."""
    refused_records: int | None = Field(default=None, ge=1)
    """`refused`: how many records the logs stream refused."""
    cap_bytes: int | None = Field(default=None, ge=0)
    """`truncated`: the per-attempt cap that was reached."""
    status: Lax[StepStatus] | None = None
    """`step_end`: how the step ended."""
    exit_code: int | None = None
    """`step_end`: the exit status of a `shell` step, if it exited."""
    outcome: Lax[Outcome] | None = None
    """`end`: the outcome the agent reports (or `failed` for a run it released)."""
    released: bool | None = None
    """`end`: the agent's shutdown stopped the run and gave the attempt back rather than reporting it."""
    lease_lost: bool | None = None
    """`end`: the attempt lost its lease (a renewal was refused or none succeeded in time); its output up to
    here is kept, but the attempt may no longer own the device."""
    reason: str | None = None
    """`end`: the reason the agent reports, if any."""
    output_bytes: int | None = Field(default=None, ge=0)
    """`end`: bytes of output the attempt produced (read from its steps)."""
    sent_bytes: int | None = Field(default=None, ge=0)
    """`end`: bytes of output carried by the attempt's output records."""

    def content(self) -> bytes:
        """The output bytes of an `output` record; empty for the other kinds.

        Raises:
            ValueError: `data` is not valid base64 although `encoding` says it is.
        """
        if self.data is None:
            return b""
        if self.encoding is DataEncoding.BASE64:
            try:
                return base64.b64decode(self.data, validate=True)
            except binascii.Error as exc:
                raise ValueError(f"log record {self.seq}: invalid base64 data") from exc
        return self.data.encode("utf-8")
