"""An attempt's output cut into log records: batching, the per-attempt cap, and the bounded buffer.

Bookkeeping only, no I/O and nothing awaited: the pipe readers hand bytes in synchronously (`output`), and
the publisher (`logstream.py`) takes encoded records (`take`) and says which were stored (`acked`). So
however slow NATS is, reading a step's output never waits for it.

- Output of one step and stream, read in a row, goes into one record of up to `record_bytes`; a record is
  closed when it is full, when the other stream or another step writes, or after `linger_s` (so a reader
  following the attempt sees a line soon after it was printed). A full record is cut after a whole UTF-8
  character where it can, so most records travel as text.
- `buffer_bytes` bounds the output held in memory (in the open record, queued, or sent and not yet
  acknowledged; encoded, a record is at most 4/3 of its output plus its envelope: text that JSON would
  escape more than that travels as base64). Output that does not fit is dropped and counted; the next
  output that fits, or the step's end, is preceded by a `dropped` record naming the range.
- `max_bytes` caps the output sent per attempt: the output record that reaches it is cut there, a
  `truncated` record follows, and later output is only counted (the end record says how much).
- Control records (`dropped`, `truncated`, `step_end`, `end`) are small and always queued.
"""

from __future__ import annotations

import base64
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from devsched.core.status import Outcome
from devsched.protocol.codec import encode
from devsched.protocol.logs import DataEncoding, LogKind, LogRecord, OutputStream
from devsched.protocol.plans import StepStatus

MiB = 1024 * 1024
#: JSON keys and values around an output record's data, at most (ids, timestamps, step name up to a
#: few hundred bytes): kept free of `max_payload` when sizing records.
_ENVELOPE_BYTES = 4096


@dataclass(frozen=True, slots=True)
class LogLimits:
    """How an attempt's output is batched and bounded (agent.toml `log_*`)."""

    #: Output bytes sent per attempt; past it, a `truncated` record and nothing more.
    max_bytes: int = 64 * MiB
    #: Output bytes held in memory at once; past it, output is dropped and counted.
    buffer_bytes: int = 8 * MiB
    #: Output bytes per record (one JetStream message).
    record_bytes: int = 64 * 1024
    #: Largest message the server takes (its `max_payload`): no record is encoded larger.
    max_payload: int = MiB
    #: How long a record that is not full waits for more output.
    linger_s: float = 0.1


@dataclass(slots=True)
class Pending:
    """A record made and not yet acknowledged by the stream."""

    seq: int
    payload: bytes
    #: Output bytes it carries (what the buffer counts).
    size: int
    #: A control record's fields, encoded into `payload` only when it is taken: a quiet attempt's
    #: records are mostly discarded unsent (`discard`), and are never encoded then.
    fields: dict[str, Any] | None = None
    #: Bytes of output the attempt had produced before it (the record's `offset`).
    offset: int = 0


@dataclass(slots=True)
class _Open:
    """The output record being filled."""

    step: str
    index: int
    stream: OutputStream
    offset: int
    at: datetime
    since: float
    data: bytearray


def utc_now() -> datetime:
    """The current UTC time."""
    return datetime.now(UTC)


def utf8_cut(data: bytes | bytearray, limit: int) -> int:
    """The largest cut at or below `limit` that does not split a UTF-8 character (`limit` when none does).

    Looks only at the last character before `limit`: bytes that are not UTF-8 anyway are cut anywhere.
    """
    if limit >= len(data):
        return len(data)
    start = limit - 1
    while start >= 0 and limit - start <= 3 and data[start] & 0xC0 == 0x80:
        start -= 1
    if start <= 0:
        return limit
    lead = data[start]
    if lead >= 0xF8:  # never a UTF-8 lead byte
        width = 1
    elif lead >= 0xF0:
        width = 4
    elif lead >= 0xE0:
        width = 3
    elif lead >= 0xC0:
        width = 2
    else:
        width = 1
    return start if start + width > limit else limit


def _base64(chunk: bytes) -> tuple[DataEncoding, str]:
    return DataEncoding.BASE64, base64.b64encode(chunk).decode("ascii")


def _text(chunk: bytes) -> tuple[DataEncoding, str]:
    """The bytes as text when they are UTF-8 whose JSON stays within base64's 4/3, else base64.

    Newlines (escaped as two bytes) are counted up front, cheaply: output that is mostly short lines
    (`yes`) goes straight to base64 instead of being encoded twice.
    """
    if chunk.count(b"\n") * 3 > len(chunk):
        return _base64(chunk)
    try:
        return DataEncoding.UTF8, chunk.decode("utf-8")
    except UnicodeDecodeError:
        return _base64(chunk)


class LogBatcher:
    """The records of one attempt's output; see the module docstring."""

    def __init__(
        self,
        task_id: uuid.UUID | str,
        attempt: int,
        limits: LogLimits | None = None,
        *,
        clock: Callable[[], datetime] = utc_now,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.task_id = uuid.UUID(str(task_id))
        self.attempt = attempt
        self.limits = limits or LogLimits()
        self._record_bytes = max(1, min(self.limits.record_bytes, self.limits.max_payload - _ENVELOPE_BYTES))
        self._clock = clock
        self._monotonic = monotonic
        self._seq = 0
        self._queue: deque[Pending] = deque()
        self._open: _Open | None = None
        self._unacked = 0
        self._ended = False
        self._drop_from = 0
        self._drop_pending = 0
        self._drop_step: tuple[str, int] | None = None
        #: Output bytes read from the steps (offset of the next byte).
        self.output_bytes = 0
        #: Output bytes put into records (what the cap counts).
        self.sent_bytes = 0
        #: Output bytes dropped because the buffer was full.
        self.dropped_bytes = 0
        #: Output bytes held: in the open record, queued, or sent and not yet acknowledged.
        self.buffered = 0
        #: Whether the cap was reached.
        self.truncated = False
        #: Records the stream refused (its host over its output rate share), and the output bytes they carried.
        self.refused_records = 0
        self.refused_bytes = 0

    # -- what the steps produce ----------------------------------------------------------------------

    def output(self, step: str, index: int, stream: OutputStream, data: bytes) -> None:
        """Take `data` that step `step` (plan index `index`) wrote to `stream`."""
        size = len(data)
        if size == 0 or self._ended:
            return
        offset = self.output_bytes
        self.output_bytes += size
        if self.truncated:
            return
        keep = min(size, self.limits.max_bytes - self.sent_bytes, self.limits.buffer_bytes - self.buffered)
        keep = max(keep, 0)
        if keep:
            self._note_dropped()
            self._append(step, index, stream, offset, data[:keep] if keep < size else data)
        if keep == size:
            return
        if self.sent_bytes >= self.limits.max_bytes:
            self._truncate(step, index, offset + keep)
            return
        if not self._drop_pending:
            self._drop_from, self._drop_step = offset + keep, (step, index)
        self._drop_pending += size - keep
        self.dropped_bytes += size - keep

    def step_end(self, step: str, index: int, status: StepStatus, exit_code: int | None) -> None:
        """Record that a step that ran has ended."""
        if self._ended:
            return
        self._close_open()
        self._note_dropped()
        self._control(LogKind.STEP_END, step=step, index=index, status=status, exit_code=exit_code)

    def end(self, outcome: Outcome, *, released: bool, lease_lost: bool, reason: str | None) -> None:
        """Record the attempt's end: its last record; later output is ignored."""
        if self._ended:
            return
        self._close_open()
        self._note_dropped()
        self._control(
            LogKind.END,
            outcome=outcome,
            released=released,
            lease_lost=lease_lost,
            reason=reason,
            dropped_bytes=self.dropped_bytes,
            output_bytes=self.output_bytes,
            sent_bytes=self.sent_bytes,
        )
        self._ended = True

    def discard(self) -> None:
        """End the attempt's records with none sent: every record made is dropped, later output ignored.

        For an attempt that printed nothing (`output_bytes` 0) and whose records were held back
        (`logstream.py`): its steps' ends are in its report.
        """
        self._open = None
        self._queue.clear()
        self._ended = True

    # -- what the publisher does ---------------------------------------------------------------------

    def linger_due(self) -> float | None:
        """Seconds until the open record is due to be closed (0: now); None when no record is open."""
        if self._open is None:
            return None
        return max(0.0, self._open.since + self.limits.linger_s - self._monotonic())

    def close_lingering(self) -> None:
        """Close the open record if it has waited `linger_s`."""
        if self.linger_due() == 0.0:
            self._close_open()

    def take(self) -> Pending | None:
        """The next record to publish, in order, if any (it stays counted until `acked`)."""
        if not self._queue:
            return None
        pending = self._queue[0]
        if pending.fields is not None:
            pending.payload = encode(LogRecord(task_id=self.task_id, attempt=self.attempt, **pending.fields))
            pending.fields = None
        self._unacked += 1
        return self._queue.popleft()

    def acked(self, pending: Pending) -> None:
        """A taken record is stored: its bytes leave the buffer."""
        self._unacked -= 1
        self.buffered -= pending.size

    def refused(self, pending: Pending) -> None:
        """A taken record was refused by the stream and is given up: its bytes leave the buffer."""
        self.acked(pending)
        self.refused_records += 1
        self.refused_bytes += pending.size

    def give_up_output(self) -> tuple[int, int]:
        """Give up the output records queued (control records stay): how many, and the output bytes they held.

        For a host whose stream refuses its records: output queued while it does would only be refused in turn.
        """
        kept: deque[Pending] = deque()
        records = size = 0
        for pending in self._queue:
            if pending.fields is None:  # an output record (control records keep their fields until taken)
                records += 1
                size += pending.size
            else:
                kept.append(pending)
        self._queue = kept
        self.buffered -= size
        self.refused_records += records
        self.refused_bytes += size
        return records, size

    def refused_record(self, seq: int, offset: int, records: int, size: int) -> bytes:
        """The encoded `refused` record of `records` refused records carrying `size` output bytes from `offset`.

        It takes the `seq` of the first record refused (never stored), so readers see it where they were.
        """
        record = LogRecord(
            task_id=self.task_id,
            attempt=self.attempt,
            seq=seq,
            kind=LogKind.REFUSED,
            at=self._clock(),
            offset=offset,
            refused_records=records,
            dropped_bytes=size,
        )
        return encode(record)

    @property
    def queued(self) -> int:
        """Records made and not yet taken."""
        return len(self._queue)

    @property
    def unacked(self) -> int:
        """Records taken and not yet acknowledged."""
        return self._unacked

    @property
    def ended(self) -> bool:
        """Whether the end record is made."""
        return self._ended

    @property
    def done(self) -> bool:
        """Whether the end record is made and every record is stored."""
        return self._ended and not self._queue and self._unacked == 0

    # -- inside --------------------------------------------------------------------------------------

    def _append(self, step: str, index: int, stream: OutputStream, offset: int, chunk: bytes) -> None:
        self.sent_bytes += len(chunk)
        self.buffered += len(chunk)
        current = self._open
        if (
            current is not None
            and current.step == step
            and current.index == index
            and current.stream is stream
            and current.offset + len(current.data) == offset
        ):
            current.data += chunk
        else:
            self._close_open()
            current = _Open(step, index, stream, offset, self._clock(), self._monotonic(), bytearray(chunk))
            self._open = current
        while len(current.data) >= self._record_bytes:
            self._close_open(self._record_bytes)
            if self._open is None:
                break

    def _close_open(self, limit: int | None = None) -> None:
        """Queue the open record, or with `limit` its first `limit` bytes (cut after a whole character)."""
        current = self._open
        if current is None:
            return
        if limit is None or len(current.data) <= limit:
            chunk = bytes(current.data)
            self._open = None
        else:
            cut = utf8_cut(current.data, limit)
            chunk = bytes(current.data[:cut])
            del current.data[:cut]
            offset, current.offset = current.offset, current.offset + cut
            self._queue_output(current, offset, chunk)
            return
        self._queue_output(current, current.offset, chunk)

    def _queue_output(self, where: _Open, offset: int, chunk: bytes) -> None:
        def output_record(encoding: DataEncoding, data: str) -> tuple[LogRecord, bytes]:
            record = self._record(
                LogKind.OUTPUT,
                at=where.at,
                offset=offset,
                step=where.step,
                index=where.index,
                stream=where.stream,
                encoding=encoding,
                data=data,
            )
            return record, encode(record)

        record, payload = output_record(*_text(chunk))
        if len(payload) > len(chunk) * 4 // 3 + _ENVELOPE_BYTES:
            # Text full of escapes (control characters) grows up to six-fold in JSON: base64 bounds every
            # message, and so the memory the buffer holds, at 4/3 of the output it carries.
            record, payload = output_record(*_base64(chunk))
        if len(payload) > self.limits.max_payload and len(chunk) > 1:
            half = utf8_cut(chunk, len(chunk) // 2)
            self._queue_output(where, offset, chunk[:half])
            self._queue_output(where, offset + half, chunk[half:])
            return
        self._push(record, payload, len(chunk))

    def _note_dropped(self) -> None:
        if not self._drop_pending:
            return
        self._close_open()
        step, index = self._drop_step or (None, None)
        self._control(LogKind.DROPPED, offset=self._drop_from, step=step, index=index, dropped_bytes=self._drop_pending)
        self._drop_pending = 0
        self._drop_step = None

    def _truncate(self, step: str, index: int, offset: int) -> None:
        self._close_open()
        self._note_dropped()
        self._control(LogKind.TRUNCATED, offset=offset, step=step, index=index, cap_bytes=self.limits.max_bytes)
        self.truncated = True

    def _control(self, kind: LogKind, **fields: Any) -> None:
        fields.setdefault("offset", self.output_bytes)
        self._seq += 1
        self._queue.append(
            Pending(
                self._seq, b"", 0, {**fields, "seq": self._seq, "kind": kind, "at": self._clock()}, fields["offset"]
            )
        )

    def _record(self, kind: LogKind, **fields: Any) -> LogRecord:
        """The next record (its `seq` is taken only when it is pushed)."""
        return LogRecord(task_id=self.task_id, attempt=self.attempt, seq=self._seq + 1, kind=kind, **fields)

    def _push(self, record: LogRecord, payload: bytes, size: int) -> None:
        self._seq = record.seq
        self._queue.append(Pending(record.seq, payload, size, offset=record.offset))
